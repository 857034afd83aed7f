"""`hpctrain data pack`: an ImageNet-layout folder (or the official ILSVRC2012 files) → WebDataset tar
shards + DALI indices + meta.json.

The work is planned first (`plan_pack`: which sample goes into which shard, from the sorted
listing and the seed), then the shards are packed in groups (contiguous runs of shards), each
by its own process here (`--workers`) or by one task of a Slurm array job (`--slurm`). A shard's
bytes depend only on the plan, so any grouping writes the same files. `meta.json`, the shard
index, is written last and only when every group is done: by `pack` here, and on Slurm by the
array task that finds all the others finished (or by the next `data pack --slurm`).

Where the samples come from is a source (data/prep/source.py): the folder, the official archives
read in place (data/prep/ilsvrc.py), Kaggle's layout (data/prep/kaggle.py) or Hugging Face's
parquet files (data/prep/hf_parquet.py); the plan holds where each sample's bytes are, so packing never
lists or indexes the source again.

Resume state lives in `OUT/.pack/` (for a pack here, too: the same command again packs only the
groups not done): `plan.json` (every shard's samples: the array tasks need no
listing of their own and cannot disagree), one `done-<group>.json` per packed group (the plan's
digest and the size of each file written), the batch script and the tasks' logs. A task whose
group is done already skips it, so re-running a task, or the whole array, is harmless.
Torch-free.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import io
import json
import multiprocessing as mp
import os
import queue
import re
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from hpctrain.data.folder import DataError, read_exclusions
from hpctrain.data.meter import Meter
from hpctrain.data.prep import hf_parquet, ilsvrc, kaggle
from hpctrain.data.prep.imagenet import scan_images, write_exclusions
from hpctrain.data.prep.source import (
    FOLDER,
    Sample,
    SampleReader,
    Source,
    check_sample,
    check_spec,
    display,
    folder_source,
)
from hpctrain.data.wds import META
from hpctrain.errors import UserError

STATE = ".pack"  # the plan and group markers (resume state) under OUT, and the Slurm array's files
PLAN = "plan.json"


@dataclass(frozen=True)
class ShardJob:
    name: str  # e.g. train-00003 → train-00003.tar, train-00003.idx
    split_root: str  # the split folder the sample paths are relative to, or the archive holding them
    samples: tuple[Sample, ...]  # each sample's key (its place in the listing) and entry (where its bytes lie)


@dataclass(frozen=True)
class PackPlan:
    out: Path
    meta: dict  # meta.json's content, known before any shard is written
    shards: tuple[ShardJob, ...]
    groups: int

    def group(self, g: int) -> tuple[ShardJob, ...]:
        """Group g's contiguous run of shards (sizes differ by at most one shard)."""
        n = len(self.shards)
        return self.shards[g * n // self.groups : (g + 1) * n // self.groups]


def shuffled(n: int, seed: int) -> list[int]:
    """0..n-1 in a seeded random order, from the standard library alone: `data pack --slurm`
    plans on a login node without numpy, and the order must not depend on the Python version
    (`random.shuffle`'s algorithm is not promised to stay)."""
    return sorted(range(n), key=lambda i: hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=8).digest())


SOURCES = {  # `data pack --from`
    FOLDER: folder_source,
    ilsvrc.ILSVRC2012: ilsvrc.archive_source,
    kaggle.KAGGLE: kaggle.kaggle_source,
    hf_parquet.HF_PARQUET: hf_parquet.parquet_source,
}
WNID = re.compile(r"n\d{8}")  # a WordNet ID: the classes a WNID → label mapping is written for


def read_source(root: str | os.PathLike, kind: str = FOLDER, exclude_file: str = "", log=print) -> Source:
    """The entries of every split of `root`, read as `--from kind` says, without the excluded ones."""
    if kind not in SOURCES:
        raise DataError(f"--from {kind!r} is not a source: choose {' or '.join(SOURCES)}")
    return SOURCES[kind](root, read_exclusions(exclude_file), log)


def plan_pack(
    root: str | os.PathLike,
    out: str | os.PathLike,
    shard_size: int,
    exclude_file: str = "",
    seed: int = 0,
    groups: int = 1,
    log=print,
    leave_out: frozenset[str] = frozenset(),
    source: str = FOLDER,
) -> PackPlan:
    """Assign every sample of `root` (read as `--from source`) to its shard: plan_source."""
    return plan_source(read_source(root, source, exclude_file, log), out, shard_size, seed, groups, log, leave_out)


def plan_source(
    src: Source,
    out: str | os.PathLike,
    shard_size: int,
    seed: int = 0,
    groups: int = 1,
    log=print,
    leave_out: frozenset[str] = frozenset(),
) -> PackPlan:
    """Assign every sample to its shard. Train is shuffled across shards (seeded) so every shard
    holds all classes; val keeps the sorted order of the listing. `leave_out`: more `split/relative
    path`s to exclude (the images found bad); a sample's key is its place in the listing without them."""
    if shard_size < 1:
        raise DataError(f"--shard-size {shard_size} must be >= 1 (e.g. 1000 images per shard)")
    if groups < 1:
        raise DataError(f"--workers {groups} must be >= 1")
    train = src.splits["train"]
    meta: dict = {"format": 1, "classes": list(train.classes), "source": src.root}
    if src.kind != FOLDER:
        meta["from"] = src.kind
    shards: list[ShardJob] = []
    for split, listing in src.splits.items():
        entries = [e for e in listing.entries if f"{split}/{e.path}" not in leave_out]
        order = shuffled(len(entries), seed) if split == "train" else list(range(len(entries)))
        records = []
        for s, lo in enumerate(range(0, len(order), shard_size)):
            name = f"{split}-{s:05d}"
            samples = tuple(Sample(int(i), entries[int(i)]) for i in order[lo : lo + shard_size])
            shards.append(ShardJob(name, listing.root, samples))
            records.append({"tar": f"{name}.tar", "idx": f"{name}.idx", "size": len(samples)})
        meta[split] = {"size": len(entries), "shards": records}
        log(f"{split}: {len(entries)} images in {len(records)} shards")
    return PackPlan(Path(out), meta, tuple(shards), min(groups, len(shards)))


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> tuple[int, int]:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    tar.addfile(info, io.BytesIO(data))
    blocks = -(-len(data) // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    return tar.offset - blocks, len(data)  # the data ends, padded, where the archive now ends


def pack_shard(job: ShardJob, out: Path) -> dict[str, int]:
    """Write one tar and its DALI index (each under a temporary name, then renamed); their sizes."""
    tag = f"{os.getpid()}.tmp"  # two writers of the same shard (a re-run task) never share a file
    tmp = out / f".{job.name}.tar.{tag}"
    lines = []
    with (
        SampleReader(job.split_root, (s.entry for s in job.samples)) as src,
        tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar,
    ):
        for sample in job.samples:
            rel, label = sample.entry.path, sample.entry.label
            key = f"{sample.key:08d}"
            ext = rel.rsplit(".", 1)[-1].lower()
            parts = [
                (ext, src.read(sample.entry)),
                ("cls", str(label).encode()),
                ("lbl", int(label).to_bytes(8, "little", signed=True)),
            ]
            comp = []
            for e, data in parts:
                off, size = _add(tar, f"{key}.{e}", data)
                comp.append(f"{e} {off} {size} {key}.{e}")
            lines.append(" ".join(comp))
    os.replace(tmp, out / f"{job.name}.tar")
    itmp = out / f".{job.name}.idx.{tag}"
    itmp.write_text(f"v1.2 {len(lines)}\n" + "\n".join(lines) + "\n")
    os.replace(itmp, out / f"{job.name}.idx")
    return {f"{job.name}.{k}": (out / f"{job.name}.{k}").stat().st_size for k in ("tar", "idx")}


class BadImages(DataError):
    """Images that do not decode: packed, they would stop training (DALI cannot skip a sample)."""


def bad_images(shards: tuple[ShardJob, ...], workers: int, log=print) -> list[tuple[str, str]]:
    """(split/relative path, reason) of every image of these shards that does not decode, sorted;
    each bad one logged by path. The check is `prepare-imagenet`'s (PIL decodes the whole file)."""
    names, specs, shown = [], [], []
    for job in shards:
        split = job.name.rsplit("-", 1)[0]
        for sample in job.samples:
            names.append(f"{split}/{sample.entry.path}")
            specs.append(check_spec(job.split_root, sample.entry))
            shown.append(display(job.split_root, sample.entry))
    # checked in the order of where the bytes lie (file, offset, row group), whatever the shuffle:
    # a parquet row group is then read once per run of its rows, an archive front to back
    order = sorted(range(len(specs)), key=lambda i: (type(specs[i]).__name__, specs[i]))
    found = scan_images([specs[i] for i in order], workers, "checking", log, check=check_sample)
    reasons: list[str | None] = [None] * len(specs)
    for i, r in zip(order, found):
        reasons[i] = r
    bad = sorted((n, r, p) for n, r, p in zip(names, reasons, shown) if r is not None)
    for _, reason, path in bad:
        log(f"bad image: {path}: {reason.splitlines()[0]}")
    return [(n, r) for n, r, _ in bad]


def refuse_bad(bad: list[tuple[str, str]], fix: str) -> BadImages:
    first = bad[0][0]
    return BadImages(
        f"{len(bad)} image(s) do not decode (listed above; the first: {first}), so nothing was packed: {fix}"
    )


def write_meta(plan: PackPlan) -> None:
    """The shard index, written atomically: readers see no index or a whole one. A pack of the
    official archives, Kaggle's folders or the parquet files gets its WNID → label mapping beside it
    (labels are not the devkit's IDs; the parquet files hold none)."""
    if plan.meta.get("from") and all(WNID.fullmatch(c) for c in plan.meta["classes"]):
        mapping = {wnid: i for i, wnid in enumerate(plan.meta["classes"])}
        mtmp = plan.out / f".{ilsvrc.MAPPING}.{os.getpid()}.tmp"
        mtmp.write_text(json.dumps(mapping, indent=1) + "\n")
        os.replace(mtmp, plan.out / ilsvrc.MAPPING)
    tmp = plan.out / f".{META}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(plan.meta, indent=1))
    os.replace(tmp, plan.out / META)


# ----------------------------------------------------------------------------- here, in parallel

_REPORT = None  # a worker's queue back to the parent's progress line


def _init_worker(reports) -> None:
    global _REPORT
    _REPORT = reports


def _pack_group(shards: tuple[ShardJob, ...], out: Path, g: int, plan_digest: str) -> None:
    pack_group(shards, out, g, plan_digest, lambda n, nbytes: _REPORT.put((n, nbytes)))


def pack(
    root: str | os.PathLike,
    out: str | os.PathLike,
    shard_size: int,
    exclude_file: str = "",
    seed: int = 0,
    workers: int = 1,
    log=print,
    exclude_bad: str = "",
    source: str = FOLDER,
) -> dict:
    """Write OUT/{split}-NNNNN.{tar,idx} and OUT/meta.json, with `workers` processes (one per
    shard group); the same bytes for any number of workers. Returns meta.json's content.

    Every image is decoded first: a bad one refuses the pack (nothing written), or, with
    `exclude_bad`, is left out and listed in that file (prepare-imagenet's format). The plan and
    one marker per finished group go to OUT/.pack, so the same pack again (after a kill, a lost
    shard) packs only the groups not done; another plan starts afresh."""
    out = Path(out)
    src = read_source(root, source, exclude_file, log)
    plan = plan_source(src, out, shard_size, seed, workers, log)
    bad = bad_images(plan.shards, workers, log)
    if exclude_bad:
        write_exclusions(exclude_bad, bad, Path(root))
        log(f"wrote {len(bad)} bad files to {exclude_bad}; they are left out of the shards")
        if bad:
            plan = plan_source(src, out, shard_size, seed, workers, log, frozenset(n for n, _ in bad))
    elif bad:
        raise refuse_bad(bad, "leave them out with --exclude-bad FILE (which lists them), or replace them")
    out.mkdir(parents=True, exist_ok=True)
    d = digest(plan_bytes(plan))
    old = load_plan(out)
    if old is None or old[1] != d:
        write_plan(plan, logs=False)  # also drops another plan's markers and the index
    (out / META).unlink(missing_ok=True)  # an interrupted pack must not look finished
    todo = missing_groups(plan, d)
    if len(todo) < plan.groups:
        log(f"resuming: {plan.groups - len(todo)} of {plan.groups} groups are packed already (the same plan): skipped")
    meter = Meter("packing", sum(len(plan.group(g)) for g in todo), "shards", log=log)
    if len(todo) <= 1:
        for g in todo:
            pack_group(plan.group(g), out, g, d, lambda n, nbytes: meter.add(n, nbytes))
    else:
        reports = mp.Queue()
        with cf.ProcessPoolExecutor(len(todo), initializer=_init_worker, initargs=(reports,)) as ex:
            futs = [ex.submit(_pack_group, plan.group(g), out, g, d) for g in todo]
            pending = set(futs)
            while pending:
                _, pending = cf.wait(pending, timeout=0.5)
                _drain(reports, meter)
            for f in futs:
                f.result()  # a worker's error (an unreadable image) ends the pack here
            _drain(reports, meter)
    write_meta(plan)
    meter.finish(
        f"packed {sum(len(plan.group(g)) for g in todo)} shards in {len(todo)} group(s) into {out} in "
        f"{meter.seconds:.1f} s ({meter.rate():.1f} MB/s)"
    )
    return plan.meta


def _drain(reports, meter: Meter) -> None:
    while True:
        try:
            _, nbytes = reports.get_nowait()
        except queue.Empty:
            return
        meter.add(1, nbytes)


# ----------------------------------------------------------------------------- Slurm array state


def plan_bytes(plan: PackPlan) -> bytes:
    shards = [{"name": s.name, "root": s.split_root, "samples": [x.row() for x in s.samples]} for s in plan.shards]
    return json.dumps(
        {"version": 1, "groups": plan.groups, "meta": plan.meta, "shards": shards}, separators=(",", ":")
    ).encode()


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def write_plan(plan: PackPlan, logs: bool = True) -> str:
    """Start a pack: the plan for the array tasks (or the groups here), no index, no markers of
    another plan; `logs`: the folder for the array tasks' logs."""
    state = plan.out / STATE
    if state.is_dir():
        for p in state.glob("done-*.json"):
            p.unlink()
    state.mkdir(parents=True, exist_ok=True)
    if logs:
        (state / "logs").mkdir(exist_ok=True)
    (plan.out / META).unlink(missing_ok=True)
    data = plan_bytes(plan)
    tmp = state / f".{PLAN}.{os.getpid()}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, state / PLAN)
    return digest(data)


def load_plan(out: str | os.PathLike) -> tuple[PackPlan, str] | None:
    """The plan under OUT/.pack and its digest; None when there is none."""
    p = Path(out) / STATE / PLAN
    if not p.is_file():
        return None
    data = p.read_bytes()
    d = json.loads(data)
    shards = tuple(ShardJob(s["name"], s["root"], tuple(Sample.of_row(x) for x in s["samples"])) for s in d["shards"])
    return PackPlan(Path(out), d["meta"], shards, int(d["groups"])), digest(data)


def _marker(out: Path, g: int) -> Path:
    return out / STATE / f"done-{g:05d}.json"


def group_done(plan: PackPlan, plan_digest: str, g: int) -> bool:
    """Group g was packed for this plan and its files are all there at the sizes written."""
    m = _marker(plan.out, g)
    if not m.is_file():
        return False
    try:
        rec = json.loads(m.read_text())
    except json.JSONDecodeError:
        return False
    if rec.get("plan") != plan_digest:
        return False
    files = rec.get("files", {})
    want = {f"{s.name}.{k}" for s in plan.group(g) for k in ("tar", "idx")}
    if set(files) != want:
        return False
    for name, size in files.items():
        p = plan.out / name
        if not p.is_file() or p.stat().st_size != size:
            return False
    return True


def missing_groups(plan: PackPlan, plan_digest: str) -> list[int]:
    return [g for g in range(plan.groups) if not group_done(plan, plan_digest, g)]


def finish(plan: PackPlan, plan_digest: str, log=print) -> bool:
    """Write the shard index when every group is done; True when it is (now or before)."""
    missing = missing_groups(plan, plan_digest)
    if missing:
        log(
            f"{len(missing)} of {plan.groups} groups not packed yet ({array_ranges(missing)}): "
            "meta.json is written when they are"
        )
        return False
    if (plan.out / META).is_file() and (plan.out / META).read_text() == json.dumps(plan.meta, indent=1):
        return True
    write_meta(plan)
    log(f"all {plan.groups} groups packed: wrote the shard index {plan.out / META}")
    return True


def pack_group(shards: tuple[ShardJob, ...], out: Path, g: int, plan_digest: str, report) -> None:
    """Pack group g's shards, then mark it done for this plan: the marker is written last, so a
    group cut short is packed again, a finished one never."""
    files: dict[str, int] = {}
    for job in shards:
        sizes = pack_shard(job, out)
        files.update(sizes)
        report(1, sum(sizes.values()))
    tmp = out / STATE / f".done-{g:05d}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"plan": plan_digest, "group": g, "files": files}))
    os.replace(tmp, _marker(out, g))


def run_group(out: str | os.PathLike, g: int, log=print) -> int:
    """One array task: pack group g (unless it is done already), then finish if it was the last."""
    loaded = load_plan(out)
    if loaded is None:
        raise DataError(
            f"{Path(out) / STATE / PLAN} is missing: start the pack with `hpctrain data pack ROOT OUT --slurm`"
        )
    plan, d = loaded
    if not 0 <= g < plan.groups:
        raise DataError(f"group {g} does not exist: the plan in {out} has groups 0-{plan.groups - 1}")
    shards = plan.group(g)
    if group_done(plan, d, g):
        log(f"group {g}: its {len(shards)} shards are packed already: skipped")
    else:
        bad = bad_images(shards, 1, log)
        if bad:
            raise refuse_bad(
                bad,
                "list them in a file (`hpctrain data prepare-imagenet ROOT --exclude-bad FILE` "
                "finds every one; for another --from, a pack here with --exclude-bad FILE) and pack "
                "again with --exclude-file FILE",
            )
        meter = Meter(f"group {g}", len(shards), "shards", log=log, tty=False)
        pack_group(shards, plan.out, g, d, lambda n, nbytes: meter.add(n, nbytes))
        meter.finish(
            f"group {g}: packed {len(shards)} shards ({shards[0].name} … {shards[-1].name}) "
            f"in {meter.seconds:.1f} s ({meter.rate():.1f} MB/s)"
        )
    finish(plan, d, log)
    return 0


def array_ranges(ids: list[int]) -> str:
    """[0, 1, 2, 5] → '0-2,5' (Slurm's --array syntax)."""
    parts, start = [], None
    for i, x in enumerate(ids):
        if start is None:
            start = x
        if i + 1 == len(ids) or ids[i + 1] != x + 1:
            parts.append(f"{start}-{x}" if x != start else f"{x}")
            start = None
    return ",".join(parts)


def main(argv: list[str] | None = None) -> int:
    """`python -m hpctrain.data.prep.pack OUT GROUP`: what each array task runs."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not args[1].isdigit():
        print("usage: python -m hpctrain.data.prep.pack OUT GROUP", file=sys.stderr)
        return 2
    try:
        return run_group(args[0], int(args[1]), log=lambda s: print(s, flush=True))
    except UserError as e:
        print(f"hpctrain: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

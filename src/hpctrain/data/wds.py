"""WebDataset shards for parallel file systems: `data pack`, shard discovery and node-local staging.

Millions of small files are slow on Lustre/GPFS; a few hundred tar shards read sequentially are
fast. Each sample is `<key>.<jpg|png|…>` (the original bytes), `<key>.cls` (label as text, for
other WebDataset tools) and `<key>.lbl` (label as int64, what DALI reads: a text .cls arrives
in DALI as raw bytes). Next to every tar goes the DALI index (`wds2idx` format v1.2), written
from the offsets while packing. `meta.json` records classes and sample counts. Torch-free.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import time
from pathlib import Path

import numpy as np

from hpctrain.data.folder import DataError, list_split, read_exclusions
from hpctrain.data.once import make_once

META = "meta.json"


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> tuple[int, int]:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    tar.addfile(info, io.BytesIO(data))
    blocks = -(-len(data) // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    return tar.offset - blocks, len(data)  # the data ends, padded, where the archive now ends


def pack(root: str | os.PathLike, out: str | os.PathLike, shard_size: int, exclude_file: str = "",
         seed: int = 0, log=print) -> dict:
    """Write OUT/{split}-NNNNN.{tar,idx} and OUT/meta.json from an ImageNet-layout folder.

    Train samples are shuffled across shards (seeded) so every shard holds all classes; val
    keeps the sorted order of the folder listing. Returns meta.json's content.
    """
    if shard_size < 1:
        raise DataError(f"--shard-size {shard_size} must be >= 1 (e.g. 1000 images per shard)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    exclude = read_exclusions(exclude_file)
    train = list_split(root, "train", exclude)
    meta: dict = {"format": 1, "classes": list(train.classes), "source": str(Path(root).resolve())}
    for split in ("train", "val"):
        if split == "val" and not (Path(root) / "val").is_dir():
            continue
        listing = train if split == "train" else list_split(root, "val", exclude, classes=train.classes)
        order = (np.random.default_rng([seed, 0x9AC]).permutation(len(listing)) if split == "train"
                 else np.arange(len(listing)))
        shards = []
        for s, lo in enumerate(range(0, len(order), shard_size)):
            name = f"{split}-{s:05d}"
            tmp = out / f".{name}.tar.tmp"
            lines = []
            with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
                for i in order[lo:lo + shard_size]:
                    rel, label = listing.samples[int(i)]
                    key = f"{int(i):08d}"
                    ext = rel.rsplit(".", 1)[-1].lower()
                    parts = [(ext, (listing.root / rel).read_bytes()), ("cls", str(label).encode()),
                             ("lbl", np.int64(label).tobytes())]
                    comp = []
                    for e, data in parts:
                        off, size = _add(tar, f"{key}.{e}", data)
                        comp.append(f"{e} {off} {size} {key}.{e}")
                    lines.append(" ".join(comp))
            tmp.replace(out / f"{name}.tar")
            (out / f"{name}.idx").write_text(f"v1.2 {len(lines)}\n" + "\n".join(lines) + "\n")
            shards.append({"tar": f"{name}.tar", "idx": f"{name}.idx", "size": len(lines)})
        meta[split] = {"size": len(listing), "shards": shards}
        log(f"{split}: {len(listing)} images in {len(shards)} shards")
    (out / META).write_text(json.dumps(meta, indent=1))
    return meta


def find_shards(root: str | os.PathLike, split: str):
    """The WdsShards of one split; FileNotFoundError when the split was not packed."""
    from hpctrain.data.dali import WdsShards

    root = Path(root)
    mp = root / META
    if not mp.is_file():
        raise DataError(f"{mp} is missing: data.format=wds needs the output of "
                        "`hpctrain data pack ROOT OUT` as data.root")
    meta = json.loads(mp.read_text())
    if split not in meta:
        raise FileNotFoundError(f"{root} has no {split} shards")
    sh = meta[split]["shards"]
    for s in sh:
        for k in ("tar", "idx"):
            if not (root / s[k]).is_file():
                raise DataError(f"{root / s[k]} is missing: re-run `hpctrain data pack`")
    return WdsShards(tuple(str(root / s["tar"]) for s in sh), tuple(str(root / s["idx"]) for s in sh),
                     int(meta[split]["size"]), tuple(meta["classes"]))


def stage(root: str | os.PathLike, dest: str, log=print) -> Path:
    """Copy the shards under `dest` (node-local) once per node; returns the staged root.

    One process per node copies (`make_once`: a lock and a `.complete` marker), the others wait.
    Each file is copied to a temporary name and renamed.
    """
    root = Path(root).resolve()
    base = Path(os.path.expandvars(os.path.expanduser(dest)))
    if "$" in str(base):
        raise DataError(f"data.stage_to={dest!r}: an environment variable in it is not set on this node")
    tag = hashlib.sha1(str(root).encode()).hexdigest()[:10]
    target = base / f"hpctrain-{root.name}-{tag}"
    t0 = time.perf_counter()

    def copy() -> str:
        if not (root / META).is_file():
            raise DataError(f"data.stage_to copies `data pack` shards, but {root / META} is missing")
        target.mkdir(parents=True, exist_ok=True)
        names = [p.name for p in root.iterdir() if p.suffix in (".tar", ".idx") or p.name == META]
        total = 0
        for name in sorted(names):
            tmp = target / f".{name}.part"
            shutil.copyfile(root / name, tmp)
            tmp.replace(target / name)
            total += (target / name).stat().st_size
        log(f"staged {len(names)} files ({total / 2**20:.1f} MiB) from {root} to {target} in "
            f"{time.perf_counter() - t0:.1f} s")
        return f"{len(names)} files, {total} bytes from {root}\n"

    make_once(target / ".complete", base / f".hpctrain-{tag}.lock", copy)
    return target

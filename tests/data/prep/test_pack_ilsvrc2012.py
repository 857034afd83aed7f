"""`hpctrain data pack --from ilsvrc2012`: a miniature of the three official files (a train tar of
per-class tars, a flat val tar, the devkit with a meta.mat whose IDs are not in WNID order), packed
in place and compared with the same images extracted and packed as a folder."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bench import ilsvrc_files
from bench.ilsvrc_files import tar_bytes
from hpctrain.data.prep import ilsvrc
from hpctrain.data.prep import pack as pk
from tests.helpers import dir_files, hpctrain
from tests.launch.jobs import hp

# WNIDs in sorted order (label = index) with devkit IDs deliberately not in that order
IDS = {"n01440764": 3, "n01443537": 1, "n01484850": 4, "n01491361": 2}
PARENT = ("n00001740", 5)  # a synset with children: not a class
PER_CLASS = 6
VAL = 9
SHARD = 5
SEED = 3


def quiet(*_):
    pass


def jpeg(rng: np.random.Generator) -> bytes:
    h, w = (int(x) for x in rng.integers(12, 40, 2))
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "JPEG", quality=80)
    return buf.getvalue()


def meta_mat() -> bytes:
    return ilsvrc_files.meta_mat(IDS, dict([PARENT]), PER_CLASS)


@pytest.fixture(scope="module")
def official(tmp_path_factory) -> tuple[Path, dict]:
    """DIR with the three files, and the truth they encode: {split: {relative path: (bytes, wnid)}}."""
    d = tmp_path_factory.mktemp("ilsvrc")
    rng = np.random.default_rng(0)
    truth: dict[str, dict[str, tuple[bytes, str]]] = {"train": {}, "val": {}}
    train = {}
    for wnid in reversed(list(IDS)):  # the outer tar's order is not the labels'
        train[wnid] = {f"{wnid}_{n}.JPEG": jpeg(rng) for n in rng.permutation(900)[:PER_CLASS]}
        truth["train"].update({f"{wnid}/{f}": (b, wnid) for f, b in train[wnid].items()})
    val_names = [f"ILSVRC2012_val_{i:08d}.JPEG" for i in range(1, VAL + 1)]
    val_wnids = [list(IDS)[int(k)] for k in rng.integers(0, len(IDS), VAL)]
    val = {n: (jpeg(rng), w) for n, w in zip(val_names, val_wnids)}
    truth["val"] = {f"{w}/{n}": (data, w) for n, (data, w) in val.items()}
    ilsvrc_files.write_official(d, train, val, IDS, dict([PARENT]))
    return d, truth


@pytest.fixture(scope="module")
def extracted(official, tmp_path_factory) -> Path:
    """The same images as the folder an extraction (and sorting val by the ground truth) gives."""
    root = tmp_path_factory.mktemp("extracted")
    for split, files in official[1].items():
        for rel, (data, _) in files.items():
            p = root / split / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
    return root


def cli_pack(source: str, d: Path, out: Path, shard: int, seed: int) -> tuple[Path, str]:
    """`hpctrain data pack --from SOURCE DIR OUT` with 2 workers (every source's tests): OUT and stdout."""
    r = hpctrain(
        "data", "pack", "--from", source, str(d), str(out),
        "--shard-size", str(shard), "--seed", str(seed), "--workers", "2", timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    return out, r.stdout


@pytest.fixture(scope="module")
def from_archives(official, tmp_path_factory) -> tuple[Path, str]:
    """The CLI's pack of DIR, and its output."""
    return cli_pack("ilsvrc2012", official[0], tmp_path_factory.mktemp("packed") / "shards", SHARD, SEED)


def shard_pairs(out: Path, split: str) -> list[tuple[bytes, int]]:
    """(image bytes, label) of every sample of a split's shards, in shard order."""
    meta = json.loads((out / "meta.json").read_text())
    pairs = []
    for rec in meta[split]["shards"]:
        with tarfile.open(out / rec["tar"]) as t:
            members = {m.name: t.extractfile(m).read() for m in t.getmembers()}
        for key in sorted({n.split(".")[0] for n in members}):
            pairs.append((members[f"{key}.jpeg"], int(members[f"{key}.cls"])))
    return pairs


def shards(d: Path) -> dict[str, bytes]:
    return {n: b for n, b in dir_files(d).items() if n.endswith((".tar", ".idx"))}


def test_archive_shards_equal_the_extracted_folders_shards_byte_for_byte(official, extracted, from_archives, tmp_path):
    out, stdout = from_archives
    folder = tmp_path / "folder"
    pk.pack(extracted, folder, SHARD, seed=SEED, log=quiet)
    assert shards(out) == shards(folder) and len(shards(out)) == 2 * (5 + 2)  # 24 train, 9 val
    wnids = sorted(IDS)
    for split, files in official[1].items():
        want = sorted((data, wnids.index(w)) for data, w in files.values())  # label: sorted-WNID index
        assert sorted(shard_pairs(out, split)) == want
    assert shard_pairs(out, "train") != sorted(shard_pairs(out, "train"))  # shuffled by the seed
    meta = json.loads((out / "meta.json").read_text())
    assert meta["classes"] == wnids and meta["from"] == "ilsvrc2012"
    assert json.loads((out / ilsvrc.MAPPING).read_text()) == {w: i for i, w in enumerate(wnids)}
    assert "note: this copy has 4 classes, 24 train and 9 val images; ImageNet-1k has 1,000, 1,281,167" in stdout


def test_nothing_is_extracted_the_output_holds_only_shards_plan_markers_and_mapping(official, from_archives):
    out, _ = from_archives
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    tars = [f"{s}-{i:05d}.{e}" for s, n in (("train", 5), ("val", 2)) for i in range(n) for e in ("idx", "tar")]
    assert names == sorted(
        [".pack/done-00000.json", ".pack/done-00001.json", ".pack/plan.json", "meta.json", ilsvrc.MAPPING, *tars]
    )
    assert sorted(p.name for p in official[0].iterdir()) == sorted([ilsvrc.DEVKIT, ilsvrc.TRAIN_TAR, ilsvrc.VAL_TAR])


def stamps(out: Path) -> dict[str, tuple[int, int]]:
    return {n: ((out / n).stat().st_ino, (out / n).stat().st_mtime_ns) for n in shards(out)}


def test_a_pack_killed_after_its_first_group_resumes_without_rewriting_finished_shards(
    official, from_archives, tmp_path
):
    out = tmp_path / "cut"
    out.mkdir()
    plan = pk.plan_pack(official[0], out, SHARD, seed=SEED, groups=2, log=quiet, source=ilsvrc.ILSVRC2012)
    pk.write_plan(plan)
    pk.run_group(out, 0, log=quiet)  # then the pack was killed
    first = stamps(out)
    assert sorted(first) == sorted(f"{j.name}.{e}" for j in plan.group(0) for e in ("tar", "idx"))
    logs: list[str] = []
    pk.pack(official[0], out, SHARD, seed=SEED, workers=2, log=logs.append, source=ilsvrc.ILSVRC2012)
    assert "resuming: 1 of 2 groups are packed already (the same plan): skipped" in logs
    assert {n: s for n, s in stamps(out).items() if n in first} == first
    assert dir_files(out) == dir_files(from_archives[0])

    lost = plan.group(1)[0].name + ".tar"  # a shard and its group's marker lost
    (out / lost).unlink()
    (out / ".pack" / "done-00001.json").unlink()
    before = stamps(out)
    pk.pack(official[0], out, SHARD, seed=SEED, workers=2, log=quiet, source=ilsvrc.ILSVRC2012)
    after = stamps(out)
    assert {n: after[n] for n in first} == {n: before[n] for n in first}
    assert dir_files(out) == dir_files(from_archives[0])


def test_a_missing_official_file_is_named_with_the_three_expected(official, tmp_path):
    d = tmp_path / "dl"
    d.mkdir()
    (d / ilsvrc.TRAIN_TAR).symlink_to(official[0] / ilsvrc.TRAIN_TAR)
    r = hpctrain("data", "pack", "--from", "ilsvrc2012", str(d), str(tmp_path / "out"), timeout=60)
    assert r.returncode == 2
    assert r.stderr == (
        f"hpctrain: error: {d} lacks {ilsvrc.VAL_TAR}, {ilsvrc.DEVKIT}: --from ilsvrc2012 reads the three "
        f"official files {ilsvrc.TRAIN_TAR}, {ilsvrc.VAL_TAR} and {ilsvrc.DEVKIT} (image-net.org) from DIR\n"
    )
    assert not (tmp_path / "out").exists()


def test_without_scipy_reading_meta_mat_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy.io", None)  # `from scipy.io import …` raises ImportError
    with pytest.raises(pk.DataError) as e:
        ilsvrc.leaf_synsets(meta_mat())
    assert str(e.value) == (
        "reading the devkit's meta.mat needs scipy, which this install lacks: pip install 'hpctrain[data]'"
    )


def test_the_devkit_maps_ids_to_leaf_wnids_only(official):
    ids, truth = ilsvrc.read_devkit(official[0] / ilsvrc.DEVKIT)
    assert ids == {i: w for w, i in IDS.items()} and len(truth) == VAL


def test_a_slurm_pack_plans_from_the_archives_on_the_login_node(official, tmp_path):
    out = tmp_path / "arr"
    r = hpctrain(
        "data", "pack", "--from", "ilsvrc2012", str(official[0]), str(out),
        "--shard-size", str(SHARD), "--workers", "2", "--slurm", "--dry-run", timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "#SBATCH --array=0-1" in r.stdout and "train: 24 images in 5 shards" in r.stderr
    assert not out.exists()


def test_an_undecodable_archive_member_refuses_the_pack_named_as_extracted(official, tmp_path):
    d = tmp_path / "dl"
    d.mkdir()
    for name in (ilsvrc.TRAIN_TAR, ilsvrc.DEVKIT):
        (d / name).symlink_to(official[0] / name)
    with tarfile.open(official[0] / ilsvrc.VAL_TAR) as t:
        val = {m.name: t.extractfile(m).read() for m in t.getmembers()}
    cut = "ILSVRC2012_val_00000002.JPEG"
    val[cut] = val[cut][: len(val[cut]) // 2]  # a truncated download
    (d / ilsvrc.VAL_TAR).write_bytes(tar_bytes(val))
    wnid = next(w for rel, (_, w) in official[1]["val"].items() if rel.endswith(cut))
    logs: list[str] = []
    first = rf"1 image\(s\) do not decode \(listed above; the first: val/{wnid}/{cut}\)"
    with pytest.raises(pk.BadImages, match=first):
        pk.pack(d, tmp_path / "out", SHARD, workers=2, log=logs.append, source=ilsvrc.ILSVRC2012)
    assert any(ln.startswith(f"bad image: {d / ilsvrc.VAL_TAR} ({wnid}/{cut}): ") for ln in logs), logs
    assert not (tmp_path / "out").exists()


def test_a_slurm_array_pack_of_the_archives_equals_the_local_pack(slurm_cluster, official, from_archives, tmp_path):
    """4 array tasks on the test cluster's nodes (the login node does no image work) read the three
    official files in place, at the offsets the login node indexed: the shards and the mapping are
    byte for byte those of the local pack of the same files."""
    out = tmp_path / "shards"
    args = ["data", "pack", "--from", "ilsvrc2012", str(official[0]), str(out), "--shard-size", str(SHARD)]
    r = hp(slurm_cluster, *args, "--seed", str(SEED), "--workers", "4", "--slurm", "--wait", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all 4 groups packed" in r.stdout, r.stdout
    assert shards(out) and shards(out) == shards(from_archives[0])
    mapping = "wnid_to_index.json"
    assert (out / mapping).read_bytes() == (from_archives[0] / mapping).read_bytes()

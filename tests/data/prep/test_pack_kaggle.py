"""`hpctrain data pack --from kaggle`: a miniature of Kaggle's imagenet-object-localization-challenge
(train in class folders, a flat val folder, LOC_val_solution.csv, LOC_synset_mapping.txt), packed in
place and compared with the same images as the sorted folder `prepare-imagenet --val-map` makes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hpctrain.data.prep import kaggle
from hpctrain.data.prep import pack as pk
from tests.data.prep.test_pack_ilsvrc2012 import cli_pack, jpeg, quiet, shard_pairs, shards
from tests.helpers import hpctrain

WNIDS = ["n01440764", "n01443537", "n01484850"]  # sorted: label = index
PER_CLASS = 4
VAL = 7
SHARD = 3
SEED = 5


@pytest.fixture(scope="module")
def download(tmp_path_factory) -> tuple[Path, dict]:
    """Kaggle's DIR, and the truth it encodes: {split: {sorted folder path: (bytes, wnid)}}."""
    d = tmp_path_factory.mktemp("kaggle")
    rng = np.random.default_rng(1)
    cls_loc = d / kaggle.CLS_LOC
    truth: dict[str, dict[str, tuple[bytes, str]]] = {"train": {}, "val": {}}
    for wnid in WNIDS:
        (cls_loc / "train" / wnid).mkdir(parents=True)
        for n in rng.permutation(500)[:PER_CLASS]:
            data = jpeg(rng)
            (cls_loc / "train" / wnid / f"{wnid}_{n}.JPEG").write_bytes(data)
            truth["train"][f"{wnid}/{wnid}_{n}.JPEG"] = (data, wnid)
    (cls_loc / "val").mkdir()
    lines = ["ImageId,PredictionString"]
    for i in rng.permutation(VAL) + 1:  # the csv's rows are not in file order
        name, wnid, data = f"ILSVRC2012_val_{i:08d}", WNIDS[int(rng.integers(0, len(WNIDS)))], jpeg(rng)
        (cls_loc / "val" / f"{name}.JPEG").write_bytes(data)
        truth["val"][f"{wnid}/{name}.JPEG"] = (data, wnid)
        lines.append(f"{name},{wnid} 12 30 200 180 {wnid} 40 50 90 99 ")
    (d / kaggle.VAL_SOLUTION).write_text("\n".join(lines) + "\n")
    (d / kaggle.SYNSETS).write_text("".join(f"{w} class {w}, a synonym\n" for w in WNIDS))
    return d, truth


@pytest.fixture(scope="module")
def from_kaggle(download, tmp_path_factory) -> tuple[Path, str]:
    return cli_pack("kaggle", download[0], tmp_path_factory.mktemp("packed") / "shards", SHARD, SEED)


def tree(d: Path) -> list[str]:
    return sorted(p.relative_to(d).as_posix() for p in d.rglob("*"))


def test_kaggle_shards_equal_the_sorted_folders_shards_byte_for_byte(download, from_kaggle, tmp_path):
    out, stdout = from_kaggle
    folder = tmp_path / "sorted"
    for split, files in download[1].items():
        for rel, (data, _) in files.items():
            (folder / split / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / split / rel).write_bytes(data)
    packed = tmp_path / "folder-shards"
    pk.pack(folder, packed, SHARD, seed=SEED, log=quiet)
    assert shards(out) == shards(packed) and len(shards(out)) == 2 * (4 + 3)  # 12 train, 7 val
    for split, files in download[1].items():
        assert sorted(shard_pairs(out, split)) == sorted((b, WNIDS.index(w)) for b, w in files.values())
    meta = json.loads((out / "meta.json").read_text())
    assert meta["classes"] == WNIDS and meta["from"] == "kaggle"
    assert json.loads((out / "wnid_to_index.json").read_text()) == {w: i for i, w in enumerate(WNIDS)}
    assert "note: this copy has 3 classes, 12 train and 7 val images" in stdout


def test_nothing_is_moved_or_copied_the_output_holds_only_shards_plan_markers_and_mapping(download, from_kaggle):
    out, _ = from_kaggle
    names = [n for n in tree(out) if n != ".pack"]
    tars = [f"{s}-{i:05d}.{e}" for s, n in (("train", 4), ("val", 3)) for i in range(n) for e in ("idx", "tar")]
    marks = [".pack/done-00000.json", ".pack/done-00001.json", ".pack/plan.json"]
    assert names == sorted([*marks, "meta.json", "wnid_to_index.json", *tars])
    val = download[0] / kaggle.CLS_LOC / "val"
    assert sorted(p.name for p in val.iterdir()) == sorted(r.split("/")[1] for r in download[1]["val"])


def test_a_wrong_dir_names_the_kaggle_layout_expected(download, tmp_path):
    d = tmp_path / "dl"
    (d / kaggle.CLS_LOC).mkdir(parents=True)
    (d / kaggle.CLS_LOC / "train").symlink_to(download[0] / kaggle.CLS_LOC / "train")
    r = hpctrain("data", "pack", "--from", "kaggle", str(d), str(tmp_path / "out"), timeout=60)
    assert r.returncode == 2
    assert r.stderr == (
        f"hpctrain: error: {d} lacks ILSVRC/Data/CLS-LOC/val/, LOC_val_solution.csv, LOC_synset_mapping.txt: "
        "--from kaggle reads Kaggle's imagenet-object-localization-challenge as downloaded: "
        "DIR/ILSVRC/Data/CLS-LOC/{train,val}/, DIR/LOC_val_solution.csv and DIR/LOC_synset_mapping.txt\n"
    )
    assert not (tmp_path / "out").exists()


def test_a_val_image_the_solution_lacks_is_named(download, tmp_path):
    d = tmp_path / "dl"
    d.mkdir()
    for name in ("ILSVRC", kaggle.SYNSETS):
        (d / name).symlink_to(download[0] / name)
    lines = (download[0] / kaggle.VAL_SOLUTION).read_text().splitlines()
    dropped = lines.pop(1).split(",")[0]
    (d / kaggle.VAL_SOLUTION).write_text("\n".join(lines) + "\n")
    with pytest.raises(pk.DataError, match=rf"{dropped}.JPEG is not in LOC_val_solution.csv"):
        pk.plan_pack(d, tmp_path / "out", SHARD, log=quiet, source=kaggle.KAGGLE)


def test_an_undecodable_val_file_is_named_by_its_sorted_folder_path(download, tmp_path):
    d = tmp_path / "dl"
    val = d / kaggle.CLS_LOC / "val"
    val.mkdir(parents=True)
    (d / kaggle.CLS_LOC / "train").symlink_to(download[0] / kaggle.CLS_LOC / "train")
    for name in (kaggle.VAL_SOLUTION, kaggle.SYNSETS):
        (d / name).symlink_to(download[0] / name)
    for p in (download[0] / kaggle.CLS_LOC / "val").iterdir():
        (val / p.name).write_bytes(p.read_bytes())
    cut = "ILSVRC2012_val_00000003.JPEG"
    (val / cut).write_bytes((val / cut).read_bytes()[:50])
    wnid = next(w for rel, (_, w) in download[1]["val"].items() if rel.endswith(cut))
    logs: list[str] = []
    with pytest.raises(pk.BadImages, match=rf"the first: val/{wnid}/{cut}\)"):
        pk.pack(d, tmp_path / "out", SHARD, log=logs.append, source=kaggle.KAGGLE)
    assert any(ln.startswith(f"bad image: {val / cut}: ") for ln in logs), logs


def test_slurm_array_tasks_read_the_flat_val_files_from_the_plan_alone(download, from_kaggle, tmp_path):
    out = tmp_path / "arr"
    plan = pk.plan_pack(download[0], out, SHARD, seed=SEED, groups=2, log=quiet, source=kaggle.KAGGLE)
    pk.write_plan(plan)
    for g in (1, 0):  # what each array task runs, in any order
        pk.run_group(out, g, log=quiet)
    assert shards(out) == shards(from_kaggle[0]) and (out / "meta.json").is_file()

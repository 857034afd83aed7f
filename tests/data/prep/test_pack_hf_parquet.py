"""`hpctrain data pack --from hf-parquet`: a miniature of Hugging Face's imagenet-1k parquet files
(`image` a struct of bytes and path, `label` the sorted-WNID index; several row groups, the rows
shuffled, a test file with label -1), packed in place and compared with the same images as an
extracted folder."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from hpctrain.data.prep import hf_parquet, parquet
from hpctrain.data.prep import pack as pk
from tests.data.prep.test_pack_ilsvrc2012 import cli_pack, jpeg, quiet, shard_pairs, shards
from tests.helpers import hpctrain

# the data extra: README command 1 leaves it out, .ci/run installs it (every test here then runs)
pa = pytest.importorskip("pyarrow", reason="pyarrow: the data extra (pip install 'hpctrain[data]')")
pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow: the data extra (pip install 'hpctrain[data]')")

WNIDS = ["n01440764", "n01443537", "n01484850"]  # sorted: label = index
PER_CLASS = 5
VAL = 8
SHARD = 4
SEED = 2
SCHEMA = pa.schema([("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])), ("label", pa.int64())])


def write(path: Path, rows: list[tuple[bytes, str, int]], group: int) -> None:
    table = pa.table(
        {"image": [{"bytes": b, "path": p} for b, p, _ in rows], "label": [lbl for _, _, lbl in rows]}, schema=SCHEMA
    )
    pq.write_table(table, path, row_group_size=group)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[Path, dict]:
    """DIR/data/*.parquet, and the truth: {split: {extracted folder path: (bytes, label)}}."""
    d = tmp_path_factory.mktemp("hf")
    (d / "data").mkdir()
    rng = np.random.default_rng(2)
    truth: dict[str, dict[str, tuple[bytes, int]]] = {"train": {}, "val": {}}
    train = []
    for label, wnid in enumerate(WNIDS):
        for n in rng.permutation(500)[:PER_CLASS]:
            train.append((jpeg(rng), f"{wnid}_{n}.JPEG", label))
    val = [(jpeg(rng), f"ILSVRC2012_val_{i:08d}.JPEG", int(rng.integers(0, len(WNIDS)))) for i in range(1, VAL + 1)]
    for split, rows in (("train", train), ("val", val)):
        truth[split] = {f"{WNIDS[lbl]}/{p}": (b, lbl) for b, p, lbl in rows}
    train = [train[i] for i in rng.permutation(len(train))]
    val = [val[i] for i in rng.permutation(len(val))]  # the files' rows are not in the folder's order
    write(d / "data" / "train-00000-of-00002.parquet", train[:9], 4)
    write(d / "data" / "train-00001-of-00002.parquet", train[9:], 4)
    write(d / "data" / "validation-00000-of-00001.parquet", val, 3)
    write(d / "data" / "test-00000-of-00001.parquet", [(jpeg(rng), "ILSVRC2012_test_00000001.JPEG", -1)], 1)
    (d / "classes.py").write_text(
        "from collections import OrderedDict\n\nIMAGENET2012_CLASSES = OrderedDict(\n    {\n"
        + "".join(f'        "{w}": "class {w}, a synonym",\n' for w in WNIDS)
        + "    }\n)\n"
    )
    return d, truth


@pytest.fixture(scope="module")
def from_parquet(dataset, tmp_path_factory) -> tuple[Path, str]:
    return cli_pack("hf-parquet", dataset[0], tmp_path_factory.mktemp("packed") / "shards", SHARD, SEED)


def test_parquet_shards_equal_the_extracted_folders_shards_byte_for_byte(dataset, from_parquet, tmp_path):
    out, stdout = from_parquet
    folder = tmp_path / "extracted"
    for split, files in dataset[1].items():
        for rel, (data, _) in files.items():
            (folder / split / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / split / rel).write_bytes(data)
    packed = tmp_path / "folder-shards"
    pk.pack(folder, packed, SHARD, seed=SEED, log=quiet)
    assert shards(out) == shards(packed) and len(shards(out)) == 2 * (4 + 2)  # 15 train, 8 val
    for split, files in dataset[1].items():
        assert sorted(shard_pairs(out, split)) == sorted(files.values())
    meta = json.loads((out / "meta.json").read_text())
    assert meta["classes"] == WNIDS and meta["from"] == "hf-parquet"
    assert json.loads((out / "wnid_to_index.json").read_text()) == {w: i for i, w in enumerate(WNIDS)}
    assert "note: this copy has 3 classes, 15 train and 8 val images" in stdout  # the test file left out


def test_nothing_is_extracted_the_output_holds_only_shards_plan_markers_and_mapping(from_parquet):
    out, _ = from_parquet
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    tars = [f"{s}-{i:05d}.{e}" for s, n in (("train", 4), ("val", 2)) for i in range(n) for e in ("idx", "tar")]
    marks = [".pack/done-00000.json", ".pack/done-00001.json", ".pack/plan.json"]
    assert names == sorted([*marks, "meta.json", "wnid_to_index.json", *tars])


def test_the_files_directly_in_dir_and_without_classes_py_give_the_same_shards(dataset, from_parquet, tmp_path):
    d = tmp_path / "flat"
    d.mkdir()
    for p in (dataset[0] / "data").iterdir():
        (d / p.name).symlink_to(p)
    out = tmp_path / "out"
    pk.pack(d, out, SHARD, seed=SEED, workers=2, log=quiet, source=hf_parquet.HF_PARQUET)
    assert shards(out) == shards(from_parquet[0])
    assert json.loads((out / "meta.json").read_text())["classes"] == ["0000", "0001", "0002"]
    assert not (out / "wnid_to_index.json").exists()  # no WNIDs known: no mapping


def test_a_dir_without_train_parquet_names_the_files_expected(tmp_path):
    r = hpctrain("data", "pack", "--from", "hf-parquet", str(tmp_path), str(tmp_path / "out"), timeout=60)
    assert r.returncode == 2
    assert r.stderr == (
        f"hpctrain: error: {tmp_path} holds no train-*.parquet, in data/ or itself: --from hf-parquet reads "
        "Hugging Face's imagenet-1k parquet files, DIR/data/train-*.parquet and "
        "DIR/data/validation-*.parquet (or the same names in DIR)\n"
    )
    assert not (tmp_path / "out").exists()


def test_without_pyarrow_reading_parquet_names_the_data_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # `import pyarrow.parquet` raises ImportError
    with pytest.raises(pk.DataError) as e:
        parquet.pq()
    assert str(e.value) == "reading parquet files needs pyarrow, which this install lacks: pip install 'hpctrain[data]'"


def test_a_pack_without_pyarrow_stops_in_one_line_naming_the_data_extra(dataset, tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "pyarrow.py").write_text("raise ImportError('pyarrow is not installed')\n")  # an install without it
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH", "")]))}
    r = hpctrain("data", "pack", "--from", "hf-parquet", str(dataset[0]), str(tmp_path / "out"), env=env, timeout=60)
    assert r.returncode == 2
    assert r.stderr == (
        "hpctrain: error: reading parquet files needs pyarrow, which this install lacks: pip install 'hpctrain[data]'\n"
    )
    assert not (tmp_path / "out").exists()


def test_a_shard_reads_each_row_group_once(dataset, monkeypatch):
    reads: list[tuple[str, int]] = []
    real = parquet._images
    monkeypatch.setattr(parquet, "_images", lambda path, g: reads.append((Path(path).name, g)) or real(path, g))
    f = str(dataset[0] / "data" / "validation-00000-of-00001.parquet")
    got = parquet.cells([(f, 2, 1), (f, 0, 2), (f, 2, 0), (f, 0, 0)])
    assert sorted(reads) == [(Path(f).name, 0), (Path(f).name, 2)] and len(got) == 4


def test_slurm_array_tasks_read_the_parquet_rows_from_the_plan_alone(dataset, from_parquet, tmp_path):
    out = tmp_path / "arr"
    plan = pk.plan_pack(dataset[0], out, SHARD, seed=SEED, groups=2, log=quiet, source=hf_parquet.HF_PARQUET)
    pk.write_plan(plan)
    for g in (1, 0):  # what each array task runs, in any order
        pk.run_group(out, g, log=quiet)
    assert shards(out) == shards(from_parquet[0]) and (out / "meta.json").is_file()

"""`hpctrain data pack`: parallel groups; what the Slurm array's tasks run (tests/launch/test_pack_array.py:
the array job itself)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.data.prep import pack as pk
from tests.helpers import dir_files, hpctrain


def quiet(*_):
    pass


@pytest.fixture(scope="module")
def serial(ident_root, tmp_path_factory) -> Path:
    """ident_root packed by one process, 5 images per shard: 8 train + 8 val shards."""
    out = tmp_path_factory.mktemp("serial")
    pk.pack(ident_root, out, 5, seed=7, log=quiet)
    return out


def test_three_workers_write_the_same_bytes_as_one(ident_root, serial, tmp_path):
    r = hpctrain(
        "data",
        "pack",
        str(ident_root),
        str(tmp_path / "w3"),
        "--shard-size",
        "5",
        "--seed",
        "7",
        "--workers",
        "3",
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "packed 16 shards in 3 group(s)" in r.stdout and "MB/s" in r.stdout
    ref = dir_files(serial)
    assert len(ref) == 2 * 16 + 1 and dir_files(tmp_path / "w3") == ref
    other = tmp_path / "seed8"  # the comparison can fail: another seed orders train differently
    pk.pack(ident_root, other, 5, seed=8, log=quiet)
    assert dir_files(other)["train-00000.tar"] != ref["train-00000.tar"]
    assert dir_files(other)["val-00000.tar"] == ref["val-00000.tar"]


def test_array_tasks_rerun_safely_and_the_index_waits_for_every_group(ident_root, serial, tmp_path):
    """What each array task runs (`python -m hpctrain.data.prep.pack OUT g`), here, in any order."""
    out = tmp_path / "arr"
    out.mkdir()
    plan = pk.plan_pack(ident_root, out, 5, seed=7, groups=3, log=quiet)
    digest = pk.write_plan(plan)
    assert [len(plan.group(g)) for g in range(3)] == [5, 5, 6]
    logs: list[str] = []
    pk.run_group(out, 2, log=logs.append)
    pk.run_group(out, 0, log=logs.append)
    assert not (out / "meta.json").exists() and pk.missing_groups(plan, digest) == [1]
    assert "1 of 3 groups not packed yet (1)" in logs[-1]
    pk.run_group(out, 0, log=logs.append)  # a re-run task: its group is done, nothing is rewritten
    assert "group 0: its 5 shards are packed already: skipped" in logs[-2]
    cut = out / plan.group(2)[0].name
    cut.with_suffix(".tar").write_bytes(b"")  # a shard lost after its group was done
    assert pk.missing_groups(plan, digest) == [1, 2]
    r = subprocess.run(
        [sys.executable, "-m", "hpctrain.data.prep.pack", str(out), "1"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "meta.json is written when they are" in r.stdout, r.stdout + r.stderr
    assert not (out / "meta.json").exists()
    pk.run_group(out, 2, log=logs.append)  # repacked; the last group done writes the index
    assert "all 3 groups packed: wrote the shard index" in logs[-1]
    assert dir_files(out) == dir_files(serial)
    bad = subprocess.run(
        [sys.executable, "-m", "hpctrain.data.prep.pack", str(out), "3"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "group 3 does not exist" in bad.stderr


def test_pack_refuses_an_undecodable_image_or_leaves_it_out_with_exclude_bad(ident_root, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(ident_root, root)
    bad = root / "train" / "c05" / "zz_bad.jpg"
    bad.write_text("this is a text file, not a JPEG\n" * 20)
    out = tmp_path / "shards"
    r = hpctrain("data", "pack", str(root), str(out), "--shard-size", "10", timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"bad image: {bad}: UnidentifiedImageError" in r.stdout
    assert r.stderr == (
        "hpctrain: error: 1 image(s) do not decode (listed above; the first: train/c05/zz_bad.jpg), "
        "so nothing was packed: leave them out with --exclude-bad FILE (which lists them), or replace "
        "them\n"
    )
    assert not out.exists()
    listed = tmp_path / "bad.txt"
    r = hpctrain(
        "data",
        "pack",
        str(root),
        str(out),
        "--shard-size",
        "10",
        "--exclude-bad",
        str(listed),
        "--workers",
        "2",
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "train with --set data.format=wds --set data.loader=dali --set data.root=" in r.stdout
    assert "train/c05/zz_bad.jpg  # UnidentifiedImageError" in listed.read_text()
    assert json.loads((out / "meta.json").read_text())["train"]["size"] == 36  # the 36 good ones


def test_an_array_task_refuses_a_group_with_an_undecodable_image(ident_root, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(ident_root, root)
    (root / "val" / "c01" / "empty.jpg").write_bytes(b"")
    out = tmp_path / "arr"
    out.mkdir()
    plan = pk.plan_pack(root, out, 5, groups=2, log=quiet)
    pk.write_plan(plan)
    pk.run_group(out, 0, log=quiet)  # train only: packed
    with pytest.raises(pk.BadImages, match=r"1 image\(s\) do not decode \(listed above; the first: val/c01/empty"):
        pk.run_group(out, 1, log=quiet)
    assert pk.missing_groups(plan, pk.load_plan(out)[1]) == [1] and not (out / "meta.json").exists()

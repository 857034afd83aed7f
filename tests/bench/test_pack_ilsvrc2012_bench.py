"""bench/pack_ilsvrc2012.py at a tiny size: its figures hang together. The task packed every image
of the official files it wrote, the CPU-time rate is positive, and ImageNet's predicted wall time
falls with the task count until the file system's bound holds it. No speed is asserted: speed
targets are benchmarks, not tests (CONTRIBUTING.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path

from hpctrain.data.prep import ilsvrc
from tests.helpers import ROOT, WAIT_S

BENCH = ROOT / "bench" / "pack_ilsvrc2012.py"
# 1 GB/s puts both tars at 155 s: above a 1,000-image task at any rate over ~7 images/s, below a
# 1.3 M-image one at any rate under ~8,000 images/s, so the bound takes over inside these N
TASKS = [1, 8, 64, 512, 4096]


def official_jpegs(d: Path) -> Counter:
    """Every JPEG in the train tar's class tars and in the val tar."""
    found: Counter = Counter()
    with tarfile.open(d / ilsvrc.TRAIN_TAR) as outer:
        for m in outer.getmembers():
            with tarfile.open(fileobj=outer.extractfile(m)) as inner:
                found.update(inner.extractfile(j).read() for j in inner.getmembers())
    with tarfile.open(d / ilsvrc.VAL_TAR) as val:
        found.update(val.extractfile(j).read() for j in val.getmembers())
    return found


def shard_jpegs(out: Path) -> Counter:
    meta = json.loads((out / "meta.json").read_text())
    found: Counter = Counter()
    for split in ("train", "val"):
        for rec in meta[split]["shards"]:
            with tarfile.open(out / rec["tar"]) as t:
                found.update(t.extractfile(m).read() for m in t.getmembers() if m.name.endswith(".jpeg"))
    return found


def test_the_task_packs_every_image_and_the_wall_time_falls_with_n_until_the_fs_bound(tmp_path):
    figures, work = tmp_path / "figures.json", tmp_path / "work"
    r = subprocess.run(
        [sys.executable, str(BENCH), "--classes", "3", "--per-class", "5", "--val", "4", "--shard-size", "4",
         "--rounds", "1", "--fs-gbs", "1", "--tasks", ",".join(map(str, TASKS)),
         "--json", str(figures), "--keep", str(work)],
        capture_output=True, text=True, timeout=WAIT_S,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    f = json.loads(figures.read_text())

    jpegs = official_jpegs(work / "official")
    assert sum(jpegs.values()) == f["miniature"]["images"] == 3 * 5 + 4 == f["packed_images"]
    assert shard_jpegs(work / "shards") == jpegs
    assert f["task"]["cpu_s"] > 0 and f["rates"]["cpu_images_per_s"] > 0 and f["rates"]["cpu_mb_per_s"] > 0

    rows = f["imagenet"]
    assert [row["tasks"] for row in rows] == TASKS
    for row in rows:
        assert row["expected_s"] == row["plan_s"] + max(row["task_cpu_rate_s"], row["fs_bound_s"])
    bound = [row["task_cpu_rate_s"] <= row["fs_bound_s"] for row in rows]
    assert not bound[0] and bound[-1], rows  # the bound takes over inside TASKS
    assert bound == sorted(bound), rows  # and, once it holds, holds for every larger N
    free = [row["expected_s"] for row, b in zip(rows, bound) if not b]
    assert all(a > b for a, b in zip(free, free[1:])), rows  # falls while the tasks' CPU sets the time
    assert len({row["expected_s"] for row, b in zip(rows, bound) if b}) == 1, rows  # flat at the bound
    assert "--fs-gbs 1 GB/s (given)" in r.stdout and "shards hold 19 of 19 images" in r.stdout

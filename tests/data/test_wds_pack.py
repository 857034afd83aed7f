"""`hpctrain data pack` shards, their DALI index, the WebDataset loader and node-local staging."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path

import pytest
import torch

from hpctrain.config import load
from hpctrain.data.build import build_loaders

pytest.importorskip("nvidia.dali")
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def packed(ident_root, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    r = subprocess.run(
        [sys.executable, "-m", "hpctrain", "data", "pack", str(ident_root), str(out), "--shard-size", "10"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return out


def wds_loaders(root, rank=0, world=1, **kw):
    sets = {
        "data.root": str(root),
        "data.loader": "dali",
        "data.format": "wds",
        "data.global_batch": 6,
        "data.workers": 1,
        "model.img_size": 24,
        "model.patch_size": 8,
        "model.num_classes": 36,
        "train.seed": 5,
    }
    sets.update(kw)
    return build_loaders(load(None, [f"{k}={v}" for k, v in sets.items()]), rank, world, CPU)


def test_pack_writes_shards_and_a_dali_index_matching_wds2idx(packed, tmp_path):
    meta = json.loads((packed / "meta.json").read_text())
    assert meta["train"]["size"] == 36 and meta["val"]["size"] == 37 and len(meta["classes"]) == 36
    assert [s["size"] for s in meta["train"]["shards"]] == [10, 10, 10, 6]
    with tarfile.open(packed / "train-00000.tar") as tar:
        names = tar.getnames()
    assert len(names) == 30 and {n.split(".", 1)[1] for n in names} == {"jpg", "cls", "lbl"}
    # our index equals the one DALI's own tool writes
    ref = tmp_path / "ref.idx"
    subprocess.run(["wds2idx", str(packed / "train-00000.tar"), str(ref)], check=True, capture_output=True)
    assert (packed / "train-00000.idx").read_text().split() == ref.read_text().split()


def test_wds_loader_contract_sharding_and_exact_eval(packed):
    train, val = wds_loaders(packed)
    train.set_epoch(0)
    batches = list(train)
    assert len(batches) == len(train) == 6
    x, y = batches[0]
    assert x.shape == (6, 3, 24, 24) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert sorted(torch.cat([b[1] for b in batches]).tolist()) == list(range(36))  # labels name samples
    for world in (2, 3):
        for e in (0, 1):
            seen = []
            for r in range(world):
                t, _ = wds_loaders(packed, r, world, **{"data.global_batch": 6 * world})
                t.set_epoch(e)
                seen += torch.cat([b[1] for b in t]).tolist()
            assert len(seen) == len(set(seen))  # disjoint shards
        real = []
        for r in range(world):
            _, v = wds_loaders(packed, r, world, **{"data.eval_batch_per_rank": 4})
            v.set_epoch(0)
            labels = torch.cat([b[1] for b in v])
            real += labels[labels >= 0].tolist()
        assert Counter(real) == Counter(j % 36 for j in range(37))
    # same seed, same batches; resume at batch 2
    a, _ = wds_loaders(packed)
    a.set_epoch(1)
    full = list(a)
    a.set_epoch(1, 2)
    resumed = list(a)
    assert all(torch.equal(p[0], q[0]) and torch.equal(p[1], q[1]) for p, q in zip(full[2:], resumed))


def test_loader_reads_the_node_local_copy(packed, tmp_path):
    """data.stage_to: the loaders read the staged copy (tests/data/test_stage.py: how it is made)."""
    dest = tmp_path / "local"
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda r: lines.append(r.getMessage())
    log = logging.getLogger("hpctrain")
    log.addHandler(handler)
    level, log.level = log.level, logging.INFO
    try:
        train, val = wds_loaders(packed, **{"data.stage_to": str(dest)})
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    staged = Path(train.shards.tars[0]).parent
    assert staged.parent == dest / f"hpctrain-{os.getuid()}" / "data" and Path(val.shards.tars[0]).parent == staged
    assert (packed / "train-00000.tar").read_bytes() == (staged / "train-00000.tar").read_bytes()
    assert any(s.startswith("staged 16 files") and s.endswith("MB/s") for s in lines), lines

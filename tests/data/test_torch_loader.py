"""The PIL loader: batch contract, determinism, resume position, sharding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hpctrain.config import ConfigError, load
from hpctrain.data import sampling
from hpctrain.data.build import build_loaders
from hpctrain.data.folder import DataError, list_split
from hpctrain.data.prep.prepare import class_problem
from tests.helpers import DIGITS


def loaders(root, world=1, rank=0, *sets):
    cfg = load(DIGITS, [f"data.root={root}", "data.loader=torch", *sets])
    return build_loaders(cfg, rank, world, torch.device("cpu"))


def test_batch_contract(digits_root):
    train, val = loaders(digits_root)
    images, labels = next(iter(train))
    assert images.shape == (64, 3, 32, 32) and images.dtype == torch.float32
    assert labels.dtype == torch.int64 and labels.shape == (64,)
    assert images.min() >= -1.01 and images.max() <= 1.01  # mean/std 0.5: [0,1] → [-1,1]
    assert len(train) == 1438 // 64
    assert sum(len(lbl) for _, lbl in val) == 359


def test_same_seed_same_batches_and_resume_position(digits_root):
    a, _ = loaders(digits_root)
    b, _ = loaders(digits_root)
    a.set_epoch(3)
    b.set_epoch(3, start=5)
    full = list(a)
    resumed = list(b)
    assert len(resumed) == len(full) - 5
    for (xa, ya), (xb, yb) in zip(full[5:], resumed):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    a.set_epoch(4)
    assert not torch.equal(next(iter(a))[0], full[0][0])


def test_ranks_split_each_global_batch(digits_root):
    one, _ = loaders(digits_root, 1, 0)
    r0, _ = loaders(digits_root, 2, 0)
    r1, _ = loaders(digits_root, 2, 1)
    x, y = next(iter(one))
    (x0, y0), (x1, y1) = next(iter(r0)), next(iter(r1))
    assert torch.equal(torch.cat([x0, x1]), x) and torch.equal(torch.cat([y0, y1]), y)


@pytest.mark.parametrize("world", [2, 3])
def test_sampling_is_a_partition(world):
    n, batch = 103, 4
    for epoch in range(2):
        parts = [np.concatenate(sampling.train_batches(n, batch * world, r, world, 0, epoch)) for r in range(world)]
        flat = np.concatenate(parts)
        assert len(set(flat.tolist())) == len(flat) == n // (batch * world) * batch * world
        ev = np.concatenate([sampling.eval_indices(n, r, world) for r in range(world)])
        assert sorted(ev.tolist()) == list(range(n))


def test_exclusions_and_missing_data(digits_root, tmp_path):
    full = list_split(digits_root, "train")
    skip = {full.samples[0][0]}
    assert len(list_split(digits_root, "train", skip)) == len(full) - 1
    with pytest.raises(DataError, match="is not a folder"):
        list_split(tmp_path, "train")


def test_the_loader_refuses_a_class_count_in_the_words_submit_uses(digits_root):
    cfg = load(DIGITS, [f"data.root={digits_root}", "data.loader=torch", "model.num_classes=5"])
    with pytest.raises(ConfigError) as e:
        build_loaders(cfg, 0, 1, torch.device("cpu"))
    assert str(e.value) == class_problem(cfg) and "has 10 classes but model.num_classes=5" in str(e.value)


def test_corrupt_image_is_named(digits_root, tmp_path):
    import shutil

    root = tmp_path / "d"
    shutil.copytree(digits_root, root)
    bad = root / "train" / "3" / "zz_bad.png"
    bad.write_bytes(b"not an image")
    train, _ = loaders(root, 1, 0, "data.global_batch=1438")
    with pytest.raises(DataError, match="zz_bad.png"):
        next(iter(train))

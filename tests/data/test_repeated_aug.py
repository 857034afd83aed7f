"""Repeated augmentation (aug.repeated_aug): DeiT's RASampler split, on the global-batch contract.

The reference is DeiT's samplers.py RASampler, transcribed: repeat each index of the permutation k
times in a row, rank r takes indices[r::W], the first floor(n // 256 * 256 / W) of them, and the
DataLoader makes batches of b with drop_last (main.py:237-242).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

from hpctrain.config import load
from hpctrain.data import sampling
from hpctrain.data.build import build_loaders
from tests.helpers import DIGITS


def rasampler(perm: np.ndarray, rank: int, world: int, repeats: int) -> list[int]:
    n = len(perm)
    num_samples = int(math.ceil(n * repeats / world))
    total = num_samples * world
    indices = np.repeat(perm, repeats).tolist()
    indices += indices[: total - len(indices)]
    indices = indices[rank:total:world]
    return indices[: int(math.floor(n // 256 * 256 / world))]


@pytest.mark.parametrize(("n", "batch", "world"), [(1438, 32, 2), (5000, 16, 8), (1000, 7, 3), (777, 64, 1)])
def test_rank_batches_are_rasampler_with_drop_last(n, batch, world):
    for epoch in (0, 1):
        perm = sampling.epoch_permutation(n, 5, epoch)
        steps = sampling.train_len(n, batch * world, 3)
        assert steps == n // 256 * 256 // (batch * world)
        for r in range(world):
            ours = sampling.train_batches(n, batch * world, r, world, 5, epoch, repeats=3)
            ref = rasampler(perm, r, world, 3)
            ref = [ref[i * batch : (i + 1) * batch] for i in range(len(ref) // batch)]  # drop_last
            assert len(ours) == len(ref) == steps
            assert [b.tolist() for b in ours] == ref


def test_each_sample_three_times_on_different_ranks_and_epoch_of_dataset_length():
    n, batch, world = 2600, 8, 4
    per_rank = [
        np.concatenate(sampling.train_batches(n, batch * world, r, world, 0, 3, repeats=3)) for r in range(world)
    ]
    flat = np.concatenate(per_rank)
    assert len(flat) == n // 256 * 256 // (batch * world) * batch * world == 2560  # epoch ≈ dataset length
    counts = Counter(flat.tolist())
    assert set(counts.values()) <= {1, 2, 3} and sum(c == 3 for c in counts.values()) >= len(counts) - 2
    for idx, c in counts.items():  # the copies of a sample are on different ranks
        assert sum(idx in set(p.tolist()) for p in per_rank) == c


@pytest.mark.parametrize("world", [1, 2, 4])
def test_global_batches_do_not_depend_on_world_size_and_resume_is_a_suffix(world):
    n, g = 1300, 16
    one = sampling.train_batches(n, g, 0, 1, 2, 7, repeats=3)
    ranks = [sampling.train_batches(n, g, r, world, 2, 7, repeats=3) for r in range(world)]
    for t, full in enumerate(one):
        assert sorted(np.concatenate([rb[t] for rb in ranks]).tolist()) == sorted(full.tolist())
    for r in range(world):
        assert [b.tolist() for b in sampling.train_batches(n, g, r, world, 2, 7, start=3, repeats=3)] == [
            b.tolist() for b in ranks[r][3:]
        ]


def test_off_is_the_plain_rule():
    for k in (0, 1):
        assert [b.tolist() for b in sampling.train_batches(500, 20, 1, 2, 0, 0, repeats=k)] == [
            b.tolist() for b in sampling.train_batches(500, 20, 1, 2, 0, 0)
        ]


def test_torch_loader_reads_the_repeated_list(digits_root):
    cfg = load(DIGITS, [f"data.root={digits_root}", "data.loader=torch", "aug.repeated_aug=3"])
    train, _ = build_loaders(cfg, 1, 2, torch.device("cpu"))
    assert len(train) == 1438 // 256 * 256 // 64 == 20
    train.set_epoch(2, start=19)
    ((x, y),) = list(train)
    want = sampling.train_batches(1438, 64, 1, 2, cfg.train.seed, 2, repeats=3)[19]
    assert torch.equal(y, torch.tensor([train.dataset.listing.samples[i][1] for i in want]))


def test_copies_of_a_sample_are_augmented_differently(digits_root):
    """Each repeat is its own augmentation (DeiT reads the sample again): same label, other pixels."""
    cfg = load(DIGITS, [f"data.root={digits_root}", "data.loader=torch", "aug.repeated_aug=3", "aug.erase_prob=0.25"])
    train, _ = build_loaders(cfg, 0, 1, torch.device("cpu"))
    x, y = next(iter(train))
    idx = sampling.train_batches(1438, 64, 0, 1, cfg.train.seed, 0, repeats=3)[0]
    copies = sampling.train_copies(1438, 64, 0, 1, repeats=3)[0]
    assert copies[:6].tolist() == [0, 1, 2, 0, 1, 2]
    for j in range(0, 63, 3):
        assert idx[j] == idx[j + 1] == idx[j + 2] and y[j] == y[j + 1] == y[j + 2]
        assert not torch.equal(x[j], x[j + 1]) and not torch.equal(x[j + 1], x[j + 2])

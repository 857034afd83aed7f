"""Random erasing applied per batch (data/erasing.py: erase_fill in the loader's workers, one copy and
one masked_scatter_ per batch): the values are bit-equal on CPU to the per-box fill it replaced, and
the ops a batch dispatches no longer grow with boxes × samples."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hpctrain.config import load
from hpctrain.data.build import build_loaders
from hpctrain.data.erasing import apply_erasing, erase_boxes, erase_fill, fill_packed, pack
from tests.helpers import DIGITS


def per_box_erasing(x: torch.Tensor, boxes: torch.Tensor, seeds: torch.Tensor, mode: str) -> torch.Tensor:
    """The per-box fill before the change (data/erasing.py apply_erasing at 3b5613f), verbatim."""
    boxes_l, seeds_l = boxes.tolist(), seeds.tolist()
    gen = None
    for i, rows in enumerate(boxes_l):
        for k, (top, left, h, w) in enumerate(rows):
            if h == 0:
                continue
            shape = (x.shape[1], h, w) if mode == "pixel" else (x.shape[1], 1, 1)
            if mode == "const":
                fill = torch.zeros(shape, dtype=x.dtype, device=x.device)
            else:
                if gen is None:
                    gen = torch.Generator(device=x.device)
                gen.manual_seed(int(seeds_l[i]) + k)
                fill = torch.randn(shape, generator=gen, dtype=torch.float32, device=x.device).to(x.dtype)
            x[i, :, top : top + h, left : left + w] = fill
    return x


def batch(n: int, count: int, size: int = 32, seed: int = 0):
    """A normalised channels_last batch (as the torch loader's Normalizer gives) and its boxes, seeds."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, size, size, 3, generator=g).permute(0, 3, 1, 2)
    boxes = torch.from_numpy(
        np.stack([erase_boxes(size, size, np.random.default_rng([seed, i]), 0.8, count) for i in range(n)])
    )
    return x, boxes, torch.arange(n) * 7919 + 11


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode", ["pixel", "rand", "const"])
def test_bit_equal_to_the_per_box_fill(mode):
    x, boxes, seeds = batch(48, 3)  # up to 3 boxes a sample: overlaps, where the later box wins
    assert (boxes[..., 2] > 0).sum(1).max() == 3
    want = per_box_erasing(x.clone(), boxes, seeds, mode)
    got = apply_erasing(x.clone(), boxes, seeds, mode)
    assert torch.equal(got, want)
    assert not torch.equal(got, x)


def test_ops_per_batch_do_not_grow_with_boxes_and_samples():
    def device_ops(n, count, fill):
        x, boxes, seeds = batch(n, count)
        if fill is per_box_erasing:
            args = (x, boxes, seeds, "pixel")
        else:  # the workers' part (erase_fill, pack) is on the CPU, in the loader's worker processes
            fills = [erase_fill(b, s, "pixel", 3, 32, 32) for b, s in zip(boxes, seeds.tolist())]
            args = (x, pack(torch.stack([m for m, _ in fills]), torch.cat([v for _, v in fills])))
        with Count() as c:
            fill(*args)
        return c.ops

    assert device_ops(4, 1, fill_packed) == device_ops(64, 3, fill_packed) <= 12
    assert device_ops(64, 3, per_box_erasing) > 10 * device_ops(4, 1, per_box_erasing)  # what it was


def test_torch_loader_erases_the_same_in_worker_processes(digits_root):
    """The erasing is composed in the workers and packed by the loader's collate: the batch is the
    same with 2 worker processes as in the main process, and erased where reprob=0 is not."""

    def first_batch(workers: int, reprob: float) -> torch.Tensor:
        cfg = load(
            DIGITS,
            [
                f"data.root={digits_root}",
                "data.loader=torch",
                f"data.workers={workers}",
                f"aug.erase_prob={reprob}",
                "aug.erase_count=3",
            ],
        )
        train, _ = build_loaders(cfg, 0, 1, torch.device("cpu"))
        train.set_epoch(1, start=2)
        return next(iter(train))[0]

    erased = first_batch(0, 0.5)
    assert torch.equal(first_batch(2, 0.5), erased)
    changed = (erased != first_batch(0, 0.0)).flatten(1).any(1)
    assert 0.2 < changed.float().mean() < 0.8

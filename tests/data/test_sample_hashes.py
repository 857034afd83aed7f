"""log.sample_hashes' must-show (issue 60): each optimizer step's hash of its global sample ids and their
augmentation seeds is the same for world sizes 1, 2, 3, 4, 6 (3 and 6, and some accumulations of 2 and
4, split unevenly) and accumulation 1, 2, 4 at one global batch, across an epoch boundary and a resume
mid-epoch, taken from what the real loaders yield (their `last_samples`), hashed by the loop's own
SampleHashes, and equal to the hash of the epoch permutation's global batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hpctrain.config import load
from hpctrain.data import sampling
from hpctrain.data.build import build_loaders
from hpctrain.train.observe.sample_hashes import SampleHashes
from tests.data.dali_images import write_jpeg

CPU = torch.device("cpu")
N, G, SEED = 140, 44, 7  # 3 optimizer steps an epoch at any accumulation: 140 // 44 = 140 // 22 // 2 = 140 // 11 // 4
WORLDS, ACCUMS = (1, 2, 3, 4, 6), (1, 2, 4)


@pytest.fixture(scope="module")
def one_per_class(tmp_path_factory) -> Path:
    """N tiny JPEGs, one per class: a sample's label is its index, so a batch's labels name what was read."""
    root = tmp_path_factory.mktemp("one_per_class")
    rng = np.random.default_rng(0)
    for i in range(N):
        write_jpeg(root / "train" / f"c{i:03d}" / "a.jpg", rng.integers(0, 256, (12, 12, 3), dtype=np.uint8))
    return root


def rank_loader(root: Path, kind: str, world: int, accum: int, rank: int):
    sets = {
        "data.root": root,
        "data.loader": kind,
        "data.workers": 1 if kind == "dali" else 0,
        "data.global_batch": G,
        "train.accum_steps": accum,
        "train.seed": SEED,
        "model.img_size": 8,
        "model.patch_size": 8,
        "model.num_classes": N,
        "data.scale_min": 0.5,
        "log.sample_hashes": "true",
    }
    cfg = load(None, [f"{k}={v}" for k, v in sets.items()])
    loader, _ = build_loaders(cfg, rank, world, CPU)
    return loader


def rank_steps(loader, accum: int, epoch: int, start: int, steps: int) -> list[dict]:
    """This rank's lines for optimizer steps start.. of `epoch`, as the loop hashes them: from what the loader
    yields (its labels are the sample indices: checked against the names it gives)."""
    loader.set_epoch(epoch, start * accum)
    it, hashes, out = iter(loader), SampleHashes(SEED, CPU, 1, None), []
    for step in range(start, start + steps):
        for _ in range(accum):
            _, labels = next(it)
            got = loader.last_samples
            assert got.epoch == epoch and got.index.tolist() == labels.tolist()
            hashes.add(got)
        out.append(hashes.step(step))
    del it
    return out


def world_hashes(root: Path, kind: str, world: int, accum: int) -> list[tuple[int, int, int, str]]:
    """(epoch, step, samples, hash) of epoch 0 and 1 in one pass, then of epoch 1 again from step 1 (a
    resume: a new loader started mid-epoch), each summed over the ranks as the all-reduce does."""
    parts = []
    for rank in range(world):
        loader = rank_loader(root, kind, world, accum, rank)
        assert loader.batch_size == sampling.rank_batch(G // accum, rank, world) and len(loader) == 3 * accum
        lines = rank_steps(loader, accum, 0, 0, 3) + rank_steps(loader, accum, 1, 0, 3)
        lines += rank_steps(rank_loader(root, kind, world, accum, rank), accum, 1, 1, 2)
        parts.append(lines)
    out = []
    for lines in zip(*parts):
        total = sum(int(line["hash"], 16) for line in lines) & sampling.HASH_MASK
        out.append((lines[0]["epoch"], lines[0]["step"], sum(line["n"] for line in lines), f"{total:016x}"))
    return out


def expected() -> list[tuple[int, int, int, str]]:
    """The global batch of each step from the epoch's permutation, hashed with its augmentation seeds."""
    out = []
    for epoch, step in [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (1, 1), (1, 2)]:
        ids = sampling.epoch_permutation(N, SEED, epoch)[step * G : (step + 1) * G]
        h = sampling.hash_sum(sampling.sample_hashes(SEED, epoch, ids, np.zeros(G, dtype=np.int64)))
        out.append((epoch, step, G, f"{h:016x}"))
    return out


@pytest.mark.parametrize("kind", ["torch", "dali"])
def test_step_hashes_do_not_depend_on_world_size_or_accumulation(one_per_class, kind):
    if kind == "dali":
        pytest.importorskip("nvidia.dali")
    want = expected()
    assert len({h for *_, h in want[:6]}) == 6  # the steps differ: the hash tells batches apart
    for world in WORLDS:
        for accum in ACCUMS:
            assert world_hashes(one_per_class, kind, world, accum) == want, (kind, world, accum)


def test_hash_is_of_the_samples_and_their_seeds_not_their_order():
    idx, copy = np.arange(10, 30), np.zeros(20, dtype=np.int64)
    h = sampling.hash_sum(sampling.sample_hashes(1, 2, idx, copy))
    assert h == sampling.hash_sum(sampling.sample_hashes(1, 2, idx[::-1], copy)) < 2**60  # order-free, 60 bits
    for other in (  # another sample, epoch, augmentation seed or repeat: another hash
        sampling.sample_hashes(1, 2, idx + 1, copy),
        sampling.sample_hashes(1, 3, idx, copy),
        sampling.sample_hashes(2, 2, idx, copy),
        sampling.sample_hashes(1, 2, idx, copy + 1),
    ):
        assert sampling.hash_sum(other) != h


@pytest.mark.parametrize("repeats", [0, 3])
def test_sampler_steps_hash_alike_for_any_world_and_accumulation_with_repeats(repeats):
    """The sampler's rule alone (DeiT's repeated augmentation too: the repeat enters the seed), over a
    whole epoch: every optimizer step's samples and seeds are one set for every world and accumulation."""
    n, gb = 1000, 48

    def steps(world: int, accum: int) -> list[int]:
        g = gb // accum
        per_rank = [
            (
                sampling.train_batches(n, g, r, world, SEED, 1, repeats=repeats),
                sampling.train_copies(n, g, r, world, repeats=repeats),
            )
            for r in range(world)
        ]
        micro = [
            sum(sampling.hash_sum(sampling.sample_hashes(SEED, 1, b[u], c[u])) for b, c in per_rank)
            & sampling.HASH_MASK
            for u in range(len(per_rank[0][0]))
        ]
        return [sum(micro[t * accum : (t + 1) * accum]) & sampling.HASH_MASK for t in range(len(micro) // accum)]

    ref = steps(1, 1)
    assert len(ref) == (n // 256 * 256 if repeats else n) // gb
    for world in (2, 3, 4, 5, 6, 7):
        for accum in (1, 2, 4):
            assert steps(world, accum) == ref, (world, accum)

"""Which samples each rank reads, per epoch — the same rule for every loader.

Training: one permutation of the dataset per (seed, epoch); optimizer step t of the epoch takes
the global batch perm[t·G:(t+1)·G], and rank r takes its contiguous slice of it. So 1 rank and
N ranks see the same global batches, and a resume at batch k of an epoch is exact.
Repeated augmentation (aug.repeated_aug = k > 1, DeiT's RASampler, deit samplers.py): the epoch's list
is the permutation with each index repeated k times in a row; global batch t is its chunk
[t·G, (t+1)·G) and rank r takes every W-th element of it from r, so the k copies of a sample go to
different ranks (as RASampler's `indices[rank::num_replicas]`). The epoch keeps DeiT's length:
⌊n/256⌋·256 samples, in whole global batches (samplers.py num_selected_samples).
Evaluation: rank r takes samples r, r+W, r+2W, …; no padding, so every sample counts once.
"""

from __future__ import annotations

import numpy as np


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(n)


def train_batches(
    n: int, batch: int, rank: int, world: int, seed: int, epoch: int, start: int = 0, repeats: int = 0
) -> list[np.ndarray]:
    """Per-rank index batches of one epoch from batch number `start` (full batches only)."""
    perm = epoch_permutation(n, seed, epoch)
    g = batch * world
    steps = train_len(n, batch, world, repeats)
    if repeats > 1:
        order = np.repeat(perm[: -(-steps * g // repeats)], repeats)  # only the samples the epoch reaches
        return [order[t * g + rank : (t + 1) * g : world] for t in range(start, steps)]
    return [perm[t * g + rank * batch : t * g + (rank + 1) * batch] for t in range(start, steps)]


def train_len(n: int, batch: int, world: int, repeats: int = 0) -> int:
    """Optimizer steps (per-rank batches) of a training epoch."""
    if repeats > 1:  # RASampler: floor(n // 256 * 256 / W) per rank, then whole batches of `batch`
        return n // 256 * 256 // (batch * world)
    return n // (batch * world)


def train_copies(n: int, batch: int, rank: int, world: int, start: int = 0, repeats: int = 0) -> list[np.ndarray]:
    """Which repeat (0..k-1) of its sample each element of `train_batches` is: the copies of a sample
    must be augmented differently (each is its own dataset read in DeiT), so it enters the sample seed."""
    g, steps = batch * world, train_len(n, batch, world, repeats)
    if repeats <= 1:
        return [np.zeros(batch, dtype=np.int64) for _ in range(start, steps)]
    return [(t * g + rank + world * np.arange(batch)) % repeats for t in range(start, steps)]


def eval_indices(n: int, rank: int, world: int) -> np.ndarray:
    return np.arange(rank, n, world)


def sample_seed(seed: int, epoch: int, index: int, copy: int = 0) -> list[int]:
    """Seed of one sample's augmentation: independent of workers, ranks and resumes. `copy`: which
    repeat of the sample (aug.repeated_aug), each with its own augmentation."""
    return [seed, epoch, int(index), 0xA06] + ([int(copy)] if copy else [])

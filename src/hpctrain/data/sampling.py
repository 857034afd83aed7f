"""Which samples each rank reads, per epoch — the same rule for every loader, at any world size.

Training: one permutation of the dataset per (seed, epoch). A micro-step takes the next chunk of
g = data.global_batch / train.accum_steps consecutive elements of it (micro-step u: perm[u·g:(u+1)·g]),
so optimizer step t always trains on the same samples, whatever the world size and accumulation.
The W ranks split each chunk unevenly where W does not divide g (`rank_share`): rank r takes
b_r = ⌊g/W⌋ + (1 if r < g mod W) samples at offset b_0 + … + b_{r-1}; the loop weights each rank's
loss by b_r·W/g (train.loop) so the averaged gradient is the global batch's mean. A rank's b_r is
the same every micro-step (DALI's pipelines have one batch size). A resume at micro-step k of an
epoch is exact. An epoch has ⌊n/g⌋ micro-steps.
Repeated augmentation (aug.repeated_aug = k > 1, DeiT's RASampler, deit samplers.py): the epoch's list
is the permutation with each index repeated k times in a row; micro-step u takes its chunk
[u·g, (u+1)·g) and rank r takes every W-th element of it from r (b_r of them, as above), so the k
copies of a sample go to different ranks (as RASampler's `indices[rank::num_replicas]`). The epoch
keeps DeiT's length: ⌊n/256⌋·256 samples, in whole chunks (samplers.py num_selected_samples).
Evaluation: rank r takes samples r, r+W, r+2W, …; no padding, so every sample counts once.
`sample_hashes` hashes what a loader yielded (log.sample_hashes): the proof that two world sizes
trained on the same samples with the same augmentation seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpctrain.batch_split import rank_share

HASH_BITS = 60  # a sample's hash; a rank's sum is taken mod 2**HASH_BITS
HASH_MASK = (1 << HASH_BITS) - 1


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(n)


def rank_batch(chunk: int, rank: int, world: int) -> int:
    """b_r: the samples rank `rank` takes from each micro-step's chunk."""
    return rank_share(chunk, rank, world)[1]


def loss_weight(chunk: int, rank: int, world: int) -> float | None:
    """b_r·W/g, the factor on a rank's mean loss that makes the ranks' averaged gradient the chunk's
    mean; None when the split is even (the factor is 1: the loss is left as it is, bit for bit)."""
    if chunk % world == 0:
        return None
    return rank_batch(chunk, rank, world) * world / chunk


def train_batches(
    n: int, chunk: int, rank: int, world: int, seed: int, epoch: int, start: int = 0, repeats: int = 0
) -> list[np.ndarray]:
    """This rank's index batches of one epoch from micro-step `start` (whole chunks only); `chunk`: the
    micro-step's global batch g, split over the ranks by `rank_share`."""
    perm = epoch_permutation(n, seed, epoch)
    steps = train_len(n, chunk, repeats)
    if repeats > 1:
        order = np.repeat(perm[: -(-steps * chunk // repeats)], repeats)  # only the samples the epoch reaches
        return [order[t * chunk + rank : (t + 1) * chunk : world] for t in range(start, steps)]
    off, b = rank_share(chunk, rank, world)
    return [perm[t * chunk + off : t * chunk + off + b] for t in range(start, steps)]


def train_len(n: int, chunk: int, repeats: int = 0) -> int:
    """Micro-steps (per-rank batches) of a training epoch: whole chunks of g, for every rank alike."""
    if repeats > 1:  # RASampler: n // 256 * 256 samples per epoch, then whole chunks
        return n // 256 * 256 // chunk
    return n // chunk


def train_copies(n: int, chunk: int, rank: int, world: int, start: int = 0, repeats: int = 0) -> list[np.ndarray]:
    """Which repeat (0..k-1) of its sample each element of `train_batches` is: the copies of a sample
    must be augmented differently (each is its own dataset read in DeiT), so it enters the sample seed."""
    steps, b = train_len(n, chunk, repeats), rank_batch(chunk, rank, world)
    if repeats <= 1:
        return [np.zeros(b, dtype=np.int64) for _ in range(start, steps)]
    return [(t * chunk + rank + world * np.arange(b)) % repeats for t in range(start, steps)]


def eval_indices(n: int, rank: int, world: int) -> np.ndarray:
    return np.arange(rank, n, world)


def sample_seed(seed: int, epoch: int, index: int, copy: int = 0) -> list[int]:
    """Seed of one sample's augmentation: independent of workers, ranks and resumes. `copy`: which
    repeat of the sample (aug.repeated_aug), each with its own augmentation."""
    return [seed, epoch, int(index), 0xA06] + ([int(copy)] if copy else [])


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 (wraps mod 2**64, as intended)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def sample_hashes(seed: int, epoch: int, index: np.ndarray, copy: np.ndarray) -> np.ndarray:
    """Each sample's 60-bit hash of its sample_seed inputs (seed, epoch, index, copy): the same
    numbers on every machine (no Python hash()). uint64."""
    h = _mix(np.full(len(index), (seed & (2**64 - 1)) ^ 0x5A3E, dtype=np.uint64))
    for part in (np.full(len(index), epoch), np.asarray(index), np.asarray(copy)):
        h = _mix(h ^ part.astype(np.int64).astype(np.uint64))
    return h & np.uint64(HASH_MASK)


def hash_sum(hashes: np.ndarray) -> int:
    """The order-free sum of sample hashes, mod 2**60: the same for any split over ranks and micro-steps."""
    return int(np.sum(hashes, dtype=np.uint64)) & HASH_MASK


@dataclass(frozen=True)
class BatchSamples:
    """The samples of one batch a loader yielded: their indices and repeats (the sample_seed inputs
    with the loader's seed and this epoch). What log.sample_hashes hashes."""

    epoch: int
    index: np.ndarray  # int64, one per sample of the batch
    copy: np.ndarray  # int64, which repeat (aug.repeated_aug; 0 without)

    def hash_sum(self, seed: int) -> int:
        return hash_sum(sample_hashes(seed, self.epoch, self.index, self.copy))

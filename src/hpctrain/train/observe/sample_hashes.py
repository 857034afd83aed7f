"""log.sample_hashes: each optimizer step's hash of the samples the ranks' loaders yielded for it, written
by rank 0 to <run>/sample_hashes.jsonl (run.sample_hashes reads it).

Each rank sums the 60-bit hashes of its batches' samples (data.sampling.BatchSamples: index, repeat,
epoch, the inputs of a sample's augmentation seed), as its loader gave them, over the step's
micro-batches; the ranks all-reduce the sums. A sum does not depend on which rank or micro-step held a
sample, so a run on another world size or accumulation that trained the same samples writes the same
hash. The sum is exact in int64: it travels as two 30-bit halves (each rank's part is < 2**30, and a
sum of W of them fits for any world), with the sample count, in one all-reduce of three int64 per step,
only when the option is on.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as td

from hpctrain.data.sampling import HASH_BITS, HASH_MASK, BatchSamples

HALF = HASH_BITS // 2
HALF_MASK = (1 << HALF) - 1


class SampleHashes:
    """One rank's part: `add` each micro-batch the loader yielded, `step` after the optimizer step."""

    def __init__(self, seed: int, device: torch.device, world_size: int, path: Path | None):
        self.seed, self.device, self.world_size, self.path = seed, device, world_size, path
        self.total, self.n, self.epoch = 0, 0, -1

    def add(self, samples: BatchSamples | None) -> None:
        if samples is None:
            raise RuntimeError(
                "log.sample_hashes: the train loader does not name the samples it yields (synthetic data, "
                "WebDataset shards): use data.loader=torch or dali on a folder, or set log.sample_hashes=false"
            )
        self.total = (self.total + samples.hash_sum(self.seed)) & HASH_MASK
        self.n += len(samples.index)
        self.epoch = samples.epoch

    def step(self, step: int) -> dict:
        """The step's line, summed over the ranks (every rank calls this, at the same step); rank 0
        (the one given a path) appends it."""
        v = torch.tensor([self.total & HALF_MASK, self.total >> HALF, self.n], dtype=torch.int64, device=self.device)
        if td.is_initialized() and self.world_size > 1:
            td.all_reduce(v)
        lo, hi, n = v.tolist()
        rec = {"step": step, "epoch": self.epoch, "n": n, "hash": f"{((hi << HALF) + lo) & HASH_MASK:016x}"}
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps(rec) + "\n")
        self.total, self.n = 0, 0
        return rec

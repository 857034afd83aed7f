"""Synthetic batches made on the device: measures the model, not the file system."""

from __future__ import annotations

import torch

from hpctrain.data.sampling import BatchSamples


class SyntheticLoader:
    """A `data.loader.Loader` like the real ones; one fixed random batch per rank, reused each step. Train:
    `chunk` is the micro-step's global batch (0: batch_size × world), which sets the epoch's length."""

    def __init__(
        self,
        *,
        train: bool,
        batch_size: int,
        world: int,
        rank: int,
        size: int,
        img_size: int,
        num_classes: int,
        seed: int,
        device: torch.device,
        chunk: int = 0,
    ):
        self.train, self.batch_size, self.world, self.rank = train, batch_size, world, rank
        self.size, self.epoch, self.start, self.chunk = size, 0, 0, chunk or batch_size * world
        self.last_samples: BatchSamples | None = None  # made, not read: no samples to name
        self.skipped: list[str] = []  # nothing to skip: the batch is made, not read
        g = torch.Generator().manual_seed(seed * 1000 + rank)
        self.images = torch.randn(batch_size, 3, img_size, img_size, generator=g).to(device)
        self.labels = torch.randint(0, num_classes, (batch_size,), generator=g).to(device)

    def __len__(self) -> int:
        if self.train:
            return max(1, self.size // self.chunk)
        n = len(range(self.rank, self.size, self.world))
        return -(-n // self.batch_size)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def __iter__(self):
        if self.train:
            for _ in range(self.start, len(self)):
                yield self.images, self.labels
            return
        left = len(range(self.rank, self.size, self.world))
        while left > 0:
            n = min(left, self.batch_size)
            labels = self.labels.clone()
            labels[n:] = -1  # padding: not counted by evaluation
            left -= n
            yield self.images, labels

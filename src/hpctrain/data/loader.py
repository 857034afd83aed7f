"""The contract every loader keeps (TorchLoader, DaliLoader, SyntheticLoader): what the training loop,
the eval pass and the task's entry use, written once so they call it directly and a type checker
holds each loader to it (docs/data.md, "The loader contract").

Torch-free at run time (data.build, which returns loaders, is imported light by the task's entry).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from hpctrain.data.sampling import BatchSamples


class Loader(Protocol):
    """One rank's batches of one split, on its device, positioned for exact resume."""

    skipped: list[str]
    """Paths of bad files skipped so far (data.on_bad_sample=skip); always empty where nothing is skipped."""

    last_samples: BatchSamples | None
    """The indices and repeats of the train batch last yielded, as the loader read them (log.sample_hashes);
    None before the first batch and where the loader does not know them (synthetic, WebDataset)."""

    def __len__(self) -> int:
        """Batches this rank reads per epoch (train: full global batches only; eval: padded to whole batches)."""
        ...

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """The next iteration reads epoch `epoch` from batch `start` (train: the resume position), as if from 0."""
        ...

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(images (N, 3, H, W) normalised, labels (N,)) on the device; label -1 marks eval padding."""
        ...

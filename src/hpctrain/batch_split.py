"""How a micro-step's g samples split over W ranks: the one rule that the login node's batch checks
(Config.rank_batch, no numpy there) and the loaders' samplers (data.sampling) both use."""

from __future__ import annotations


def rank_share(chunk: int, rank: int, world: int) -> tuple[int, int]:
    """(offset, size) of rank `rank`'s part of a micro-step's chunk: the first chunk mod W ranks take one
    more sample than the others."""
    q, extra = divmod(chunk, world)
    return rank * q + min(rank, extra), q + (rank < extra)

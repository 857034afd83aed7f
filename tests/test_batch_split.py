"""The split of a micro-step's g samples over W ranks: one rule for the login node's batch checks
(Config.rank_batch) and the samplers (data.sampling), with no sample lost or read twice."""

from __future__ import annotations

import pytest

from hpctrain.batch_split import rank_share
from hpctrain.config import load
from hpctrain.data import sampling


@pytest.mark.parametrize(("chunk", "world"), [(8, 4), (10, 4), (7, 3), (5, 5), (128, 12), (4096, 48)])
def test_the_shares_tile_the_chunk_and_differ_by_at_most_one(chunk, world):
    shares = [rank_share(chunk, r, world) for r in range(world)]
    assert [off for off, _ in shares] == [sum(b for _, b in shares[:r]) for r in range(world)]
    assert sum(b for _, b in shares) == chunk
    assert max(b for _, b in shares) - min(b for _, b in shares) == (0 if chunk % world == 0 else 1)
    assert [b for _, b in shares] == sorted((b for _, b in shares), reverse=True)  # the larger shares first


@pytest.mark.parametrize(("global_batch", "accum", "world"), [(64, 1, 6), (64, 2, 6), (60, 1, 4), (96, 4, 5)])
def test_the_config_and_the_samplers_give_each_rank_the_same_batch(global_batch, accum, world):
    cfg = load("digits_vit", [f"data.global_batch={global_batch}", f"train.accum_steps={accum}"])
    g = global_batch // accum
    got = [cfg.rank_batch(world, r) for r in range(world)]
    assert got == [sampling.rank_batch(g, r, world) for r in range(world)]
    assert sum(got) == g and cfg.per_rank_batch(world) == max(got) == -(-g // world)

"""What the stop agreement costs a step, and how often to hold it (`dist.stop_every`), resolved at
submission from the plan's step time (login node, no torch; docs/communication.md, "Every K steps").

The agreement is an all-reduce of 8 int32 stop bits on a gloo group (train/collective.py `PendingBits`).
torch's ProcessGroupGloo runs it as `gloo::allreduce` without naming an algorithm, and gloo's
UNSPECIFIED is its ring (gloo/allreduce.cc): a reduce-scatter then an allgather around the ring,
each segment handed on rank to rank, so even 32 bytes take 2(p-1) hops of latency one after the
other. Over TCP a hop is a kernel send, the wire and a wake-up of the receiver's gloo thread.

The round is posted at one agreement boundary and read K steps later, so it runs while the K steps
do: what it costs the steps is the loop's own time to post and read it, plus any part of the round
that outlasts the K steps. K is the smallest with the round inside half the K steps (MARGIN: a hop
slower under load) and that cost within BUDGET of a step; and K steps last at most WAIT_MAX_S,
since a stop waits up to 2K steps (the signal may come just after a round was posted) and the
partition's GraceTime must cover that and the checkpoint (plan.ckpt_cost.stop_problems).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from hpctrain.config import Config

# One hop of gloo's TCP ring between nodes, assumed: 100 µs, the 2-rank per-hop figure of
# bench/stop_agreement.py on loopback (86-104 µs: kernel TCP both ways and the wake-up of the
# receiver's gloo thread, on a shared 2-core machine), which lies between the published gloo figures for two
# servers over TCP (a 1 KB ring all-reduce at 354 µs p50, ~180 µs a hop) and over ibverbs (39 µs,
# ~20 µs a hop; pytorch/gloo#158). Pessimistic for a quiet 100 GbE fabric (~15-30 µs); erring high
# only makes K larger, which the WAIT_MAX_S bound keeps short. The bench takes another with --hop-us.
HOP_S = 100e-6
# The training loop's own time per round (post + read a completed round): the 2-rank median of
# bench/stop_agreement.py on this project's CPU machine (143 µs, bench/results/stop_agreement-cpu.json;
# 129 µs in an earlier run). It does not grow with the ranks: the round runs in gloo's threads.
HOST_S = 140e-6
BUDGET = 0.01  # at most this share of a step
MARGIN = 2.0  # the round must fit in half the steps it has
WAIT_MAX_S = 1.0  # K steps last at most this: a stop waits up to 2K steps


def ring_hops(ranks: int) -> int:
    """Hops of latency in one gloo ring all-reduce over `ranks`: 2(p-1)."""
    return 2 * (ranks - 1) if ranks > 1 else 0


def round_s(ranks: int, hop_s: float = HOP_S) -> float:
    """One agreement round over `ranks` at `hop_s` a hop (a tiny tensor: latency only)."""
    return ring_hops(ranks) * hop_s


@dataclass(frozen=True)
class StopEvery:
    """The agreement's period and what it costs at it."""

    every: int  # K: steps between agreement boundaries
    step_s: float  # the step time it was chosen for
    round_s: float  # one round's modelled latency
    cost: float  # share of the step time the agreement costs at K
    capped: bool  # K was held to WAIT_MAX_S / step: the cost may exceed BUDGET


def cost(every: int, step_s: float, round_: float, host_s: float = HOST_S) -> float:
    """The share of each step that a round every `every` steps costs: the loop's post and read, and
    any part of the round that outlasts the `every` steps it overlaps, spread over them."""
    span = every * step_s
    return (host_s + max(0.0, round_ - span)) / span


def choose(step_s: float, ranks: int, hop_s: float = HOP_S, host_s: float = HOST_S) -> StopEvery:
    """K for a job of `ranks` whose step takes `step_s` (module docstring)."""
    if step_s <= 0:
        raise ValueError(f"step time {step_s!r}: must be positive")
    r = round_s(ranks, hop_s)
    if ranks <= 1:  # no group: a round is the rank's own bits
        return StopEvery(1, step_s, 0.0, 0.0, False)
    k = max(1, math.ceil(MARGIN * r / step_s), math.ceil(host_s / (BUDGET * step_s)))
    cap = max(1, math.floor(WAIT_MAX_S / step_s))
    return StopEvery(min(k, cap), step_s, r, cost(min(k, cap), step_s, r, host_s), k > cap)


def with_stop_every(cfg: Config, planned_step_s: float | None, ranks: int) -> tuple[Config, str]:
    """`cfg` with dist.stop_every resolved (0: from the plan's step time; 1 without one), and the
    line `submit` prints about it."""
    if cfg.dist.stop_every > 0:
        k = cfg.dist.stop_every
        return cfg, f"stop agreement: every {k} step{'s' if k > 1 else ''} (dist.stop_every)"
    if ranks <= 1:
        k, line = 1, "stop agreement: every step (one rank: nothing to wait for)"
    elif planned_step_s is None:
        k, line = 1, "stop agreement: every step (no planned step time to spread it over: a CPU job)"
    else:
        c = choose(planned_step_s, ranks)
        k = c.every
        line = (
            f"stop agreement: every {k} step{'s' if k > 1 else ''} (dist.stop_every): a gloo round over {ranks} "
            f"ranks ~{c.round_s * 1e3:.2f} ms ({ring_hops(ranks)} hops x {HOP_S * 1e6:.0f} µs) against a planned "
            f"{planned_step_s * 1e3:.1f} ms step: {100 * c.cost:.2f} % of it"
            + (f"; held to {WAIT_MAX_S:g} s of steps, above the 1 % budget" if c.capped else "")
        )
    return dataclasses.replace(cfg, dist=dataclasses.replace(cfg.dist, stop_every=k)), line

"""Name the rank that holds a synchronous job up, and say whether data or compute is to blame.

Under DDP every rank's wall time per step is the same: the gradient all-reduce makes the fast
ranks wait for the slowest. What differs is each rank's *own* time, the part of a step no other
rank can hold up: its data wait (next(loader)) and its forward pass (timed by `Clock`: the host
clock on CPU, CUDA events on GPU, read after the log step's loss sync so nothing waits). Every
log interval each rank posts [wall step time, data wait, own time] per step in its row of a
world × 3 tensor, summed by a non-blocking all-reduce on the gloo control group; the sum is read
at the next log boundary (or the end of the run), like the stop flags (collective.PendingBits), so the
collective never sits on a step's critical path.

With `health.exclude_straggler_frac` a rank that stays above it for EXCLUDE_AFTER log intervals in a
row has its node named to the batch shell (hpctrain.run.badnodes) and the run stops at that step with a
checkpoint (stop kind `exclude`): every rank reads the same summed tensor, so every rank decides
alike at the same step, with no extra collective. The shell goes on without the node: on a spare
in the same job, else by a requeue with the node in ExcNodeList (launch.inplace).
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import time
from typing import Any

import torch
import torch.distributed as td

from hpctrain.config.schema import HealthConfig
from hpctrain.run import badnodes
from hpctrain.train.dist import DistInfo

log = logging.getLogger("hpctrain")
TEST_DELAY_ENV = "HPCTRAIN_TEST_DELAY"
EXCLUDE_AFTER = 3  # log intervals in a row above health.exclude_straggler_frac before the node is left out


def find_straggler(own_s: list[float], data_s: list[float], step_s: float, pct: float) -> dict | None:
    """The slowest rank when its own time per step exceeds the median rank's by more than `pct`
    % of the step time (`step_s`, what the excess costs every rank per step), else None.

    The cause is "data" when the rank's extra data wait (over the median data wait) makes up at
    least half of its excess, else "compute".
    """
    if len(own_s) < 2 or step_s <= 0:
        return None
    median = statistics.median(own_s)
    rank = max(range(len(own_s)), key=own_s.__getitem__)
    excess = own_s[rank] - median
    slower = 100.0 * excess / step_s
    if excess <= 0 or slower <= pct:
        return None
    data_excess = data_s[rank] - statistics.median(data_s)
    return {
        "rank": rank,
        "step_time_s": own_s[rank],
        "median_s": median,
        "slower_pct": slower,
        "cause": "data" if data_excess >= 0.5 * excess else "compute",
        "data_wait_s": data_s[rank],
    }


def injected_delay(rank: int, env=None) -> tuple[float, str]:
    """Test-only hook: HPCTRAIN_TEST_DELAY="rank:seconds:where" (where: data | compute | preflight)
    slows that rank by `seconds` per step in its data wait or its forward, or per timed repetition of
    its preflight matmul (health.preflight); (0, "") otherwise."""
    spec = (os.environ if env is None else env).get(TEST_DELAY_ENV, "")
    if not spec:
        return 0.0, ""
    try:
        r, seconds, where = spec.split(":")
        if where not in ("data", "compute", "preflight"):
            raise ValueError(where)
        return (float(seconds), where) if int(r) == rank else (0.0, "")
    except ValueError:
        raise ValueError(f"{TEST_DELAY_ENV}={spec!r}: expected rank:seconds:data|compute|preflight") from None


class Clock:
    """Time of one region of each step (the forward), summed until `take`; adds no sync.

    Off (one rank: nothing to compare) it does nothing. On CUDA it records an event pair per
    region and reads them only when they are complete, which they are after the log step's
    loss `.item()`; a pair still running is left out rather than waited for.
    """

    def __init__(self, device, enabled: bool, delay_s: float = 0.0):
        self.enabled, self.delay_s = enabled, delay_s
        self.cuda = enabled and getattr(device, "type", None) == "cuda"
        self._t0 = 0.0
        self._total = 0.0
        self._events: list = []

    @staticmethod
    def _recorded_event():
        """A timing event recorded on the current stream (no wait for the device)."""
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def start(self) -> None:
        if not self.enabled:
            return
        if self.cuda:
            self._events.append([self._recorded_event(), None])
        else:
            self._t0 = time.perf_counter()
        if self.delay_s:
            time.sleep(self.delay_s)

    def stop(self) -> None:
        if not self.enabled:
            return
        if self.cuda:
            self._events[-1][1] = self._recorded_event()
        else:
            self._total += time.perf_counter() - self._t0

    def take(self) -> float:
        """Seconds summed since the last call."""
        total, self._total = self._total, 0.0
        events, self._events = self._events, []
        for a, b in events:
            if b is not None and b.query():
                total += a.elapsed_time(b) / 1000.0
        return total


class StragglerWatch:
    """One round in flight at a time: `post` at a log boundary, `settle` at the next (or the end).

    Every rank calls both at the same steps (log boundaries are step numbers every rank knows),
    so the rounds match. Rank 0 logs and records a straggler; one process does nothing.
    """

    def __init__(self, rank: int, world: int, local_rank: int, group, pct: float, metrics, exclude_pct: float = 0.0):
        self.rank, self.world, self.local_rank = rank, world, local_rank
        self.group, self.pct, self.metrics, self.exclude_pct = group, pct, metrics, exclude_pct
        self.places: list[tuple[str, int, str]] | None = None  # (host, local rank, Slurm node) per rank
        self.exclude: dict | None = None  # the straggler whose node is to be left out (set on every rank)
        self._streak: tuple[int | None, int] = (None, 0)  # (rank, log intervals in a row over exclude_pct)
        self._work = None
        self._tensor = None
        self._step = 0
        self._steps = 0  # the steps of the window in flight
        self.excess_s = 0.0  # settled rounds' slowest own time over the median, times their steps (not yet taken)
        self.data_s = 0.0  # settled rounds' median data wait, times their steps (not yet taken)

    @classmethod
    def for_run(cls, health: HealthConfig, dist: DistInfo, group, metrics) -> StragglerWatch:
        """A run's watch: health.straggler_frac and exclude_straggler_frac as the percent of a step
        the detector counts in."""
        pct, exclude = (round(f * 100, 9) for f in (health.straggler_frac, health.exclude_straggler_frac))
        return cls(dist.rank, dist.world_size, dist.local_rank, group, pct, metrics, exclude)

    @property
    def active(self) -> bool:
        return self.world > 1 and td.is_initialized()

    def open(self) -> None:
        """Learn every rank's host and GPU once (a blocking gather at start-up)."""
        if not self.active or self.places is not None:
            return
        places: list[Any] = [None] * self.world
        td.all_gather_object(places, (socket.gethostname(), self.local_rank, badnodes.this_node()), group=self.group)
        self.places = [tuple(p) for p in places]

    def post(self, step: int, step_s: float, data_s: float, own_s: float, steps: int = 1) -> None:
        """Start this window's round (non-blocking) of `steps` steps, after settling the previous one."""
        if not self.active:
            return
        self.settle()
        self._steps = steps
        self._tensor = torch.zeros(self.world, 3, dtype=torch.float64)
        self._tensor[self.rank] = torch.tensor([step_s, data_s, own_s], dtype=torch.float64)
        self._work = td.all_reduce(self._tensor, group=self.group, async_op=True)
        self._step = step

    def settle(self) -> dict | None:
        """Wait for the round in flight, if any (it had a whole log interval), and report it."""
        if self._work is None:
            return None
        work, self._work = self._work, None
        work.wait()
        rows = self._tensor.tolist()
        own = [r[2] for r in rows]
        self.excess_s += max(0.0, max(own) - statistics.median(own)) * self._steps
        self.data_s += statistics.median(r[1] for r in rows) * self._steps
        found = find_straggler(
            [r[2] for r in rows],
            [r[1] for r in rows],
            statistics.median(r[0] for r in rows),
            min(self.pct, self.exclude_pct or self.pct),
        )
        if found and found["slower_pct"] <= self.pct:  # over exclude_pct only (set below straggler_pct)
            self.track(found)
            return None
        self.track(found)
        if found and self.rank == 0:
            host, gpu, _ = (self.places or [("?", -1, "")] * self.world)[found["rank"]]
            found = {
                "step": self._step,
                "rank": found["rank"],
                "host": host,
                "gpu": gpu,
                **{k: v for k, v in found.items() if k != "rank"},
            }
            log.warning(
                "straggler at step %d: rank %d (host %s, GPU %d) is %.0f%% of a step slower than "
                "the median rank (own time %.3f s vs %.3f s per step); its time goes to %s "
                "(data wait %.3f s per step)",
                found["step"],
                found["rank"],
                host,
                gpu,
                found["slower_pct"],
                found["step_time_s"],
                found["median_s"],
                found["cause"],
                found["data_wait_s"],
            )
            self.metrics.write("straggler", **found)
        return found

    def take(self) -> dict[str, float]:
        """Over the rounds settled since the last call: `straggler_s`, the seconds the slowest rank's
        own time outlasted the median rank's (what every rank waited for it), and `data_wait_median_s`,
        the median rank's data wait: the goodput ledger's two (a slow loader on one rank is its
        straggler excess, not everyone's data wait). Empty with one process."""
        if not self.active:
            return {}
        out = {"straggler_s": round(self.excess_s, 4), "data_wait_median_s": round(self.data_s, 4)}
        self.excess_s = self.data_s = 0.0
        return out

    def track(self, found: dict | None) -> dict | None:
        """Count the log intervals in a row that the same rank is over exclude_pct; at EXCLUDE_AFTER,
        set `exclude` (on every rank: `found` is the same everywhere) and, on rank 0, name its node
        to the batch shell. Returns `exclude`."""
        if not self.exclude_pct or self.exclude:
            return self.exclude
        rank = found["rank"] if found and found["slower_pct"] > self.exclude_pct else None
        n = self._streak[1] + 1 if rank is not None and rank == self._streak[0] else int(rank is not None)
        self._streak = (rank, n)
        if n < EXCLUDE_AFTER:
            return None
        host, _, node = (self.places or [("?", -1, "")] * self.world)[rank]
        why = (
            f"rank {rank} a straggler for {n} log intervals in a row, {found['slower_pct']:.0f} % of a step "
            f"slower than the median (health.exclude_straggler_frac={self.exclude_pct / 100:g})"
        )
        self.exclude = {"step": self._step, "rank": rank, "host": host, "node": node, "why": why}
        if self.rank == 0:
            log.warning("leaving node %s out: %s; checkpointing and stopping at this step", node or host, why)
            self.metrics.write("straggler_exclude", **self.exclude)
            try:
                badnodes.report(node or host, why)
            except (OSError, ValueError) as e:
                log.warning("could not name node %r to the batch shell: %s", node or host, e)
        return self.exclude

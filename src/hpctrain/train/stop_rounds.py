"""When the ranks stop: the stop decision at start-up and at each step boundary (train.stop).

A policy object the Trainer is given (built from its stop flag when none is), so a test that
needs a rank to be late at one boundary subclasses `at_boundary` instead of patching the Trainer.
"""

from __future__ import annotations

import time

from hpctrain.train import stop as stopmod
from hpctrain.train.collective import PendingBits, agree_bits


class StopRounds:
    """This rank's stop bits, OR-ed over every rank by an all-reduce on the gloo control group that
    is started at one agreement boundary and read at the next, so it never holds a step up.

    Agreement boundaries are `every` steps apart (dist.stop_every, K; plan.stop_cost picks it so a
    round costs at most 1 % of a step): a round posted after step s is read after step s+K, having
    had K steps to complete. Between them a signal stays latched in the flag (StopFlag.received is
    never cleared) and is posted with the next round. The boundaries are agreed values: the step
    the last round was posted at, on every rank alike."""

    def __init__(self, flag: stopmod.StopFlag, group=None, every: int = 1) -> None:
        self.flag, self.group, self.every = flag, group, max(1, every)
        self.round = PendingBits(group)  # this rank's stop bits, agreed `every` steps later
        self.due: int | None = None  # the step boundary that reads the round in flight
        self.waited_s = 0.0  # spent waiting for rounds since the last `take_wait`

    def at_start(self, step: int, halt_at: int) -> int:
        """At start-up, once: every rank's stop request OR-ed together (a blocking all-reduce on the
        control group), so a signal that came during start-up stops every rank before a step."""
        self.flag.log_new()
        bits = self.flag.bits()
        if halt_at > 0 and step >= halt_at:
            bits |= stopmod.BITS["halt"]
        return agree_bits(bits, self.group)

    def at_boundary(self, step: int, total: int, halt_at: int, exclude: bool) -> int:
        """At a step boundary: the stop bits to act on now, without waiting for the other ranks.

        At an agreement boundary (`due`) the OR read here was started K steps before and had those
        steps to complete; every rank reads the same round, so all stop at this same step (and
        rank 0 learns the kind when only another rank was signalled). halt_at needs no agreement:
        every rank knows it, nor does `exclude` (settled at this boundary on every rank alike);
        either reads the round in flight early, on every rank alike, so its bits name the kind.
        A new round starts unless this boundary stops or ends the run, so nothing is in flight
        when the loop is left.
        """
        self.flag.log_new()
        bits = 0
        if halt_at > 0 and step >= halt_at:
            bits |= stopmod.BITS["halt"]
        if exclude:
            bits |= stopmod.BITS["exclude"]
        if self.due is not None and (step >= self.due or bits or step >= total):
            bits |= self.settle()
        if not bits and step < total and self.due is None:
            self.start(step)
        return bits

    def start(self, step: int) -> None:
        """Post this rank's bits after `step`: the round the boundary K steps on reads."""
        self.round.start(self.flag.bits())
        self.due = step + self.every

    def settle(self) -> int:
        """Wait for the round in flight, if any (every path out of the loop does)."""
        self.due = None
        t0 = time.perf_counter()
        bits = self.round.result()
        self.waited_s += time.perf_counter() - t0
        return bits

    def take_wait(self) -> float:
        """Seconds this rank waited for rounds since the last call: the part of the rounds that
        outlasted the K steps they had (plan.stop_cost's model says none; the train record shows it)."""
        waited, self.waited_s = self.waited_s, 0.0
        return waited

    def close(self) -> None:
        """Settle, then let go of the control group (see `Trainer.close`). Idempotent."""
        self.settle()
        self.round, self.group = PendingBits(None), None

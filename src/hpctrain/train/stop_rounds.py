"""When the ranks stop: the stop decision at start-up and at each step boundary (train.stop).

A policy object the Trainer is given (built from its stop flag when none is), so a test that
needs a rank to be late at one boundary subclasses `at_boundary` instead of patching the Trainer.
"""

from __future__ import annotations

from hpctrain.train import stop as stopmod
from hpctrain.train.dist import PendingBits, agree_bits


class StopRounds:
    """This rank's stop bits, OR-ed over every rank by an all-reduce on the gloo control group that
    is started at one step boundary and read at the next, so it never holds a step up."""

    def __init__(self, flag: stopmod.StopFlag, group=None) -> None:
        self.flag, self.group = flag, group
        self.round = PendingBits(group)  # this rank's stop bits, agreed one step later

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

        The OR read here was started at the previous boundary and had a whole step to complete;
        every rank reads the same round, so all stop at this same step (and rank 0 learns the
        kind when only another rank was signalled). halt_at needs no agreement: every rank
        knows it, nor does `exclude` (settled at this boundary on every rank alike). A new round
        starts unless this boundary stops or ends the run, so nothing is in flight when the loop
        is left.
        """
        self.flag.log_new()
        bits = self.round.result()
        if halt_at > 0 and step >= halt_at:
            bits |= stopmod.BITS["halt"]
        if exclude:
            bits |= stopmod.BITS["exclude"]
        if not bits and step < total:
            self.start()
        return bits

    def start(self) -> None:
        """Post this rank's bits: the round the next boundary reads."""
        self.round.start(self.flag.bits())

    def settle(self) -> int:
        """Wait for the round in flight, if any (every path out of the loop does)."""
        return self.round.result()

    def close(self) -> None:
        """Settle, then let go of the control group (see `Trainer.close`). Idempotent."""
        self.round.result()
        self.round, self.group = PendingBits(None), None

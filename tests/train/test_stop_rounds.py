"""StopRounds' schedule in one process (no group: a round is the rank's own bits, read when due):
which boundaries read a round, where a latched signal is acted on, and that nothing is left in
flight. The same schedule on 4 gloo ranks: tests/train/test_stop_every.py."""

from __future__ import annotations

import signal

import pytest

from hpctrain.train import stop
from hpctrain.train.stop_rounds import StopRounds
from tests.train.stop_every_worker import agreed_stop


def _first_stop(every: int, signal_during: int, total: int = 30, halt_at: int = 0) -> tuple[int, int, StopRounds]:
    """Run the boundaries of a loop whose rank is sent SIGTERM while step `signal_during` runs:
    (the step it stops at, the bits, the policy)."""
    flag = stop.StopFlag()
    rounds = StopRounds(flag, None, every)
    rounds.start(0)
    for step in range(1, total + 1):
        if step == signal_during:
            flag.handler(signal.SIGTERM, None)  # the handler only records it: latched
        bits = rounds.at_boundary(step, total, halt_at, False)
        if bits:
            return step, bits, rounds
    raise AssertionError("no stop")


@pytest.mark.parametrize("every", [1, 2, 3, 5])
@pytest.mark.parametrize("signal_during", [1, 4, 6, 7])
def test_a_latched_signal_is_acted_on_one_period_after_the_next_round_is_posted(every, signal_during):
    step, bits, rounds = _first_stop(every, signal_during)
    assert step == agreed_stop(0, every, signal_during - 1) and stop.kind_of(bits) == "preemption"
    assert step - signal_during < 2 * every  # within 2K steps of the signal
    assert not rounds.round.pending and rounds.due is None  # the stopping boundary posts nothing


def test_a_halt_between_agreement_boundaries_reads_the_round_in_flight_early():
    step, bits, rounds = _first_stop(3, signal_during=2, halt_at=5)  # posted at 3 with TERM, due at 6
    assert step == 5 and stop.kind_of(bits) == "preemption" and bits & stop.BITS["halt"]
    assert not rounds.round.pending


def test_the_last_step_reads_the_round_and_posts_none():
    flag = stop.StopFlag()
    rounds = StopRounds(flag, None, 4)
    rounds.start(0)
    assert [rounds.at_boundary(s, 6, 0, False) for s in range(1, 7)] == [0] * 6
    assert not rounds.round.pending and rounds.due is None
    assert rounds.take_wait() >= 0 and rounds.take_wait() == 0

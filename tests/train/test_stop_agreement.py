"""The stop agreement is off the critical path: 2 gloo ranks, instrumented (tests/train/stop_worker.py).

No rank waits for the others at a step boundary, yet all stop at the same step: the OR of the
stop bits posted at one boundary is read at the next, so a signal that arrives while step n runs
stops every rank at the end of step n+1, with one checkpoint there.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_metrics, run_ranks
from tests.train.stop_worker import OVERLAP, SIGNAL


@pytest.mark.slow
def test_boundary_does_not_wait_and_a_signal_stops_every_rank_one_step_later(digits_root, tmp_path):
    run_ranks(2, ["-m", "tests.train.stop_worker", str(digits_root), str(tmp_path)], timeout=180)
    r0, r1 = (json.loads((tmp_path / f"result-{r}.json").read_text()) for r in (0, 1))
    # OVERLAP: rank 0 began step OVERLAP+1 before rank 1 posted its bits (else a deadlock, 30 s, failure)
    assert OVERLAP in r0["began"]
    # SIGUSR2 reached rank 1 while step SIGNAL+1 ran; posted at its end, read and acted on one step later
    stop_step = SIGNAL + 2
    for r in (r0, r1):
        assert (r["status"], r["stop_kind"], r["step"]) == ("preempted", "time_limit", stop_step)
        assert r["began"] == list(range(stop_step))
    stops = run_metrics(tmp_path / "run", "stop")
    assert [(s["step"], s["stop_kind"]) for s in stops] == [(stop_step, "time_limit")]
    # ckpt.every=3: the save at step 3 ran its collectives with a round in flight; the stop
    # at step 6, a ckpt_every step too, writes one checkpoint
    assert [c["step"] for c in run_metrics(tmp_path / "run", "checkpoint")] == [3, stop_step]

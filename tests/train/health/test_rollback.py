"""A rollback's reason is a `guard.Reason`: the records and the log name it as before (the strings
`hpctrain status` and older runs' metrics.jsonl hold), and the error that stops the run says which."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from hpctrain.config import HealthConfig
from hpctrain.run.metrics import MetricsWriter
from hpctrain.train.health.guard import Diverged, Reason
from hpctrain.train.health.rollback import diverged, report
from hpctrain.train.state import TrainState
from hpctrain.watch.render import divergence_text
from hpctrain.watch.summary import summarize


@pytest.mark.parametrize(("reason", "written"), [(Reason.NONFINITE, "nonfinite"), (Reason.SPIKE, "spike")])
def test_the_rollback_record_and_log_name_the_reason_as_before(reason, written, tmp_path, caplog):
    metrics = MetricsWriter(tmp_path / "metrics.jsonl")
    state = TrainState(step=10, data_offset=5, rollbacks=1)
    with caplog.at_level(logging.WARNING, logger="hpctrain"):
        report(Diverged(15, reason, {}), Path("step-00000010"), 5, state, HealthConfig(), metrics)
    metrics.close()
    (rec,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert (rec["kind"], rec["reason"], rec["from_step"], rec["step"]) == ("rollback", written, 15, 10)
    assert caplog.records[-1].getMessage().startswith(f"{written} at step 15: rolled back to step-00000010")
    event = {"kind": "nonfinite", "step": 15, "reason": rec["reason"]}  # as rollback.restore writes it
    assert divergence_text(summarize([event, rec])).startswith(f"1 event(s), 1 rollback(s); last: {written} at step 15")


@pytest.mark.parametrize(
    ("reason", "what"), [(Reason.NONFINITE, "a non-finite loss or gradient norm"), (Reason.SPIKE, "a loss spike")]
)
def test_the_stop_error_says_which_event_stopped_the_run(reason, what):
    e = diverged(Diverged(15, reason, {}), "health.on_nonfinite=stop", None)
    assert str(e).startswith(f"training stopped at step 15: {what} (health.on_nonfinite=stop); no good checkpoint")
    assert "\n" not in str(e)


def test_a_reason_is_known_by_the_name_records_hold():
    """Reading a record's reason back (e.g. a tool over metrics.jsonl) gives the member."""
    assert [Reason(r) for r in ("nonfinite", "spike")] == [Reason.NONFINITE, Reason.SPIKE]
    with pytest.raises(ValueError):
        Reason("a loss spike")

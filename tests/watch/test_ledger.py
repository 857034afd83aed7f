"""sacct's rows as the goodput ledger's allocations (watch/ledger.py): the shapes the Slurm tests met."""

from __future__ import annotations

from hpctrain.watch.jobinfo import merge_resized
from hpctrain.watch.ledger import allocations_of, jobs_of, sacct_time

T = "2026-12-07T05:{:02d}:{:02d}"


def row(state: str, submit: tuple[int, int], start: tuple[int, int] | None, end: tuple[int, int] | None) -> dict:
    return {
        "JobID": "7",
        "State": state,
        "Submit": T.format(*submit),
        "Start": T.format(*start) if start else "Unknown",
        "End": T.format(*end) if end else "Unknown",
    }


def test_a_requeue_is_a_second_allocation_with_its_own_submit():
    rows = [row("REQUEUED", (0, 0), (0, 1), (1, 0)), row("COMPLETED", (0, 59), (1, 10), (2, 0))]
    a, b = allocations_of("7", rows)
    assert (a.start - a.submit, b.start - b.submit) == (1, 11)  # the requeue's wait from its own Submit
    assert (a.restart, b.restart, b.state) == (0, 1, "COMPLETED")


def test_a_shrunk_allocation_keeps_the_submit_and_start_it_had_before_its_node_died():
    """The fault campaign's rows (22.05, --no-kill): REQUEUED, then RESIZING (the second allocation before
    a node died), then COMPLETED, whose Submit and Start are the shrink's."""
    rows = [
        row("REQUEUED", (0, 0), (0, 1), (1, 0)),
        row("RESIZING", (0, 59), (1, 10), (1, 50)),
        row("COMPLETED", (1, 50), (1, 50), (2, 10)),
    ]
    a, b = allocations_of("7", merge_resized(rows))
    assert b.submit == sacct_time(T.format(0, 59)) and b.start == sacct_time(T.format(1, 10))
    assert b.end == sacct_time(T.format(2, 10)) and b.restart == 1


def test_a_running_or_pending_row():
    rows = [row("RUNNING", (0, 0), (0, 5), None), row("PENDING", (0, 0), None, None)]
    (a,) = allocations_of("7", rows)
    assert a.end is None and sacct_time("Unknown") is None


def test_the_jobs_of_a_run_are_its_records_and_the_current_one():
    recs = [{"kind": "startup", "job": "5"}, {"kind": "restart", "job": 5}, {"kind": "startup", "job": None}]
    assert jobs_of(recs, "9") == ["5", "9"] and jobs_of([], None) == []

"""The requeue decision rank 0 takes after a stop, with separate caps for preemptions and the rest."""

from __future__ import annotations

import json

import pytest

from hpctrain.errors import LaunchError
from hpctrain.run.requeue import Budget, after_stop, budget, check_budget, decide


def test_time_limit_requeues_are_capped_by_max_requeues():
    b = Budget("42", restarts=0, preemptions=0, max_requeues=2, max_preemptions=-1)
    assert decide("time_limit", b) == (True, "requeueing job 42 after its time limit (1/2)")
    ok, why = decide("time_limit", Budget("42", 2, 0, 2, -1))
    assert not ok and "max_requeues=2" in why
    assert not decide("time_limit", Budget("42", 0, 0, 0, -1))[0]
    assert not decide("halt", b)[0]  # HPCTRAIN_HALT_AT is a planned stop


def test_a_node_left_out_is_requeued_within_max_requeues():
    """Stop kind `exclude` (health.exclude_straggler_frac named a node): the batch shell goes on without
    it, on a spare or by a requeue, counted like a time limit."""
    ok, why = decide("exclude", Budget("42", 0, 0, 2, -1))
    assert ok and "without a straggling node" in why and "(1/2)" in why
    ok, why = decide("exclude", Budget("42", 2, 0, 2, -1))
    assert not ok and "max_requeues=2" in why and "left in" in why


def test_a_straggler_stop_with_a_spare_free_restarts_in_the_job_whatever_the_budget(tmp_path):
    """With a healthy spare left (HPCTRAIN_SPARES_FREE, from the batch shell) the node is left out by
    an in-job restart, not a requeue: a spent max_requeues does not keep the straggler in."""
    ok, why = decide("exclude", Budget("42", 2, 0, 2, -1, spares_free=1))
    assert ok and "on a spare (1 free)" in why
    assert budget(tmp_path, {"SLURM_JOB_ID": "42", "HPCTRAIN_SPARES_FREE": "2"}).spares_free == 2


def test_preemptions_do_not_use_up_the_time_limit_budget():
    """A preemptible partition may preempt a long run many times: unlimited by default."""
    b = Budget("7", restarts=12, preemptions=12, max_requeues=1, max_preemptions=-1)
    assert b.others == 0
    assert decide("preemption", b) == (True, "requeueing job 7 after preemption 13")
    assert decide("time_limit", b)[0]  # its one time-limit requeue is still there
    capped = Budget("7", restarts=3, preemptions=2, max_requeues=5, max_preemptions=2)
    ok, why = decide("preemption", capped)
    assert not ok and "max_preemptions=2" in why
    check_budget(capped)
    with pytest.raises(LaunchError, match="preempted 3 times"):
        check_budget(Budget("7", 3, 3, 5, 2))
    with pytest.raises(LaunchError, match="restarted 2 times for time limits or failures"):
        check_budget(Budget("7", restarts=4, preemptions=2, max_requeues=1, max_preemptions=-1))


def test_budget_counts_this_jobs_preemption_requeues_from_the_run(tmp_path):
    recs = [
        {"kind": "requeue", "job": "5", "reason": "preemption", "requeue": True, "step": 3},
        {"kind": "requeue", "job": "5", "reason": "time_limit", "requeue": True, "step": 6},
        {"kind": "requeue", "job": "4", "reason": "preemption", "requeue": True, "step": 1},  # another job
        {"kind": "requeue", "job": "5", "reason": "preemption", "requeue": False, "step": 9},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    b = budget(tmp_path, {"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "3", "HPCTRAIN_MAX_REQUEUES": "4"})
    assert (b.restarts, b.preemptions, b.others, b.max_requeues, b.max_preemptions) == (3, 1, 2, 4, -1)
    assert budget(tmp_path, {}) is None


def test_stop_decision_goes_to_the_stop_file_for_the_batch_shell(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    stop_file = tmp_path / ".hpctrain" / "stop-5"
    env = {"SLURM_JOB_ID": "5", "HPCTRAIN_STOP_FILE": str(stop_file), "HPCTRAIN_MAX_REQUEUES": "1"}
    summary = {"status": "preempted", "stop_kind": "time_limit", "step": 8, "rank": 0, "run_dir": str(run)}
    assert after_stop(summary, env=env) is True
    assert stop_file.read_text().splitlines() == ["requeue", "requeueing job 5 after its time limit (1/1)"]
    env["SLURM_RESTART_COUNT"] = "1"
    assert after_stop(summary, env=env) is False
    assert stop_file.read_text().splitlines()[0] == "end"
    assert after_stop({**summary, "status": "finished"}, env=env) is False
    assert after_stop(summary, env={"SLURM_JOB_ID": "5"}) is False  # not under our batch script


def test_status_reads_a_stopped_run(tmp_path):
    """A run whose last record is a stop says so; once resumed past it, it no longer does."""
    from hpctrain.watch.status import run_status

    recs = [
        {"kind": "train", "step": 4, "epoch": 0.2, "loss": 2.0},
        {"kind": "checkpoint", "step": 4, "path": "ck/step-4.pt"},
        {"kind": "stop", "step": 4, "reason": "preempted", "stop_kind": "preemption"},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "job.json").write_text(json.dumps({"job_id": "7", "executor": "local"}))
    text = run_status(str(tmp_path)).text()
    assert "stopped at step 4: preemption" in text and "stops          1 (1 after preemption (TERM))" in text
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "train", "step": 5, "epoch": 0.25, "loss": 1.9}) + "\n")
        f.write(json.dumps({"kind": "end", "step": 5, "status": "finished"}) + "\n")
    st = run_status(str(tmp_path))
    assert st.state == "COMPLETED" and "stopped at" not in st.text() and "last step      5" in st.text()


def test_task_refuses_a_submitit_other_than_the_submitters(monkeypatch):
    import signal

    import submitit

    from hpctrain.launch import task

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR2)}
    monkeypatch.setenv("HPCTRAIN_SUBMITIT_VERSION", "0.0.1")
    try:
        with pytest.raises(SystemExit, match=f"submitted with submitit 0.0.1 but this task has {submitit.__version__}"):
            task.main(["/nonexistent"])
    finally:  # task.main installs the stop handlers: give pytest its own back
        for s, h in saved.items():
            signal.signal(s, h)
        from hpctrain.train import stop

        stop.STOP.installed = False

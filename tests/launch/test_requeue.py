"""The requeue decision every rank takes alike after a USR2 stop (counted and capped)."""

from __future__ import annotations

from hpctrain.launch.requeue import after_stop, decide


def test_decide_counts_and_caps_requeues():
    assert decide({})[0] is False  # not under Slurm: nothing to requeue
    ok, why = decide({"SLURM_JOB_ID": "42", "HPCTRAIN_MAX_REQUEUES": "2"})
    assert ok and "1/2" in why
    ok, why = decide({"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "1", "HPCTRAIN_MAX_REQUEUES": "2"})
    assert ok and "2/2" in why
    ok, why = decide({"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "2", "HPCTRAIN_MAX_REQUEUES": "2"})
    assert not ok and "max_requeues=2" in why
    assert not decide({"SLURM_JOB_ID": "42", "HPCTRAIN_MAX_REQUEUES": "0"})[0]


def test_only_a_preempted_run_is_requeued(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert after_stop({"status": "finished"}, 0) is False
    assert after_stop({"status": "halted"}, 0) is False
    assert after_stop({"status": "preempted", "step": 3}, 1) is False  # no Slurm job: keep the result


def test_status_reads_a_stopped_run(tmp_path):
    """A run whose last record is a stop says so; once resumed past it, it no longer does."""
    import json

    from hpctrain.launch.status import run_status

    recs = [{"kind": "train", "step": 4, "epoch": 0.2, "loss": 2.0},
            {"kind": "checkpoint", "step": 4, "path": "ck/step-4.pt"},
            {"kind": "stop", "step": 4, "reason": "preempted"}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "job.json").write_text(json.dumps({"job_id": "7", "executor": "local"}))
    text = run_status(str(tmp_path)).text()
    assert "stopped at step 4: preempted" in text and "requeues       1" in text
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "train", "step": 5, "epoch": 0.25, "loss": 1.9}) + "\n")
        f.write(json.dumps({"kind": "end", "step": 5, "status": "finished"}) + "\n")
    st = run_status(str(tmp_path))
    assert st.state == "COMPLETED" and "stopped at" not in st.text() and "last step      5" in st.text()

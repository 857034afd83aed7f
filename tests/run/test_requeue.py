"""The requeue decision rank 0 takes after a stop, with separate caps for preemptions and the rest."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hpctrain.errors import LaunchError
from hpctrain.run.requeue import (
    Budget,
    after_stop,
    budget,
    check_budget,
    decide,
    read_starts,
    record_start,
    stalled,
)


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
    from hpctrain.watch.render import status_text
    from hpctrain.watch.summary import run_status

    recs = [
        {"kind": "train", "step": 4, "epoch": 0.2, "loss": 2.0},
        {"kind": "checkpoint", "step": 4, "path": "ck/step-4.pt"},
        {"kind": "stop", "step": 4, "reason": "preempted", "stop_kind": "preemption"},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "job.json").write_text(json.dumps({"job_id": "7", "executor": "local"}))
    text = status_text(run_status(str(tmp_path)))
    assert "stopped at step 4: preemption" in text and "stops          1 (1 after preemption (TERM))" in text
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "train", "step": 5, "epoch": 0.25, "loss": 1.9}) + "\n")
        f.write(json.dumps({"kind": "end", "step": 5, "status": "finished"}) + "\n")
    st = run_status(str(tmp_path))
    assert st.state == "COMPLETED" and "stopped at" not in status_text(st) and "last step      5" in status_text(st)


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


# ---------------------------------------------------------------- progress (the crash-loop guard)


def ledger_env(tmp_path, restart: int, max_requeues: int = 1) -> dict[str, str]:
    ctl = tmp_path / ".hpctrain"
    ctl.mkdir(exist_ok=True)
    return {
        "SLURM_JOB_ID": "9",
        "SLURM_RESTART_COUNT": str(restart),
        "HPCTRAIN_MAX_REQUEUES": str(max_requeues),
        "HPCTRAIN_CONTROL_DIR": str(ctl),
    }


def checkpoint(run, step: int) -> None:
    """What train.ckpt leaves: checkpoints/latest naming the newest file."""
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    (run / "checkpoints" / "latest").write_text(f"step-{step}.pt\n")


def test_time_limit_stops_that_checkpointed_never_spend_max_requeues(tmp_path):
    """Five windows in a row with slurm.max_requeues=1, each starting where the last stopped and
    checkpointing at its stop: every one is requeued, none spends the cap (the log line says 0/1)."""
    run = tmp_path / "run"
    run.mkdir()
    for attempt in range(5):
        env = ledger_env(tmp_path, attempt)
        record_start(run, env)
        check_budget(budget(run, env))
        checkpoint(run, 10 * (attempt + 1))  # the stop's checkpoint
        b = budget(run, env)
        assert b.progress and b.others == 0, b
        ok, why = decide("time_limit", b)
        assert ok and "not spent (0/1" in why, why
    starts = read_starts(tmp_path / ".hpctrain" / "progress-9")
    assert starts == {0: "-", 1: "step-10.pt", 2: "step-20.pt", 3: "step-30.pt", 4: "step-40.pt"}


def test_attempts_without_a_newer_checkpoint_spend_max_requeues(tmp_path):
    """A crash loop: every attempt starts from step-10 and writes nothing newer. The first such attempt
    may be requeued (1/1); after it the cap is spent, and a restart beyond it is refused at the start."""
    run = tmp_path / "run"
    checkpoint(run, 10)
    env = ledger_env(tmp_path, 0)
    record_start(run, env)
    assert decide("time_limit", budget(run, env)) == (True, "requeueing job 9 after its time limit (1/1)")
    env = ledger_env(tmp_path, 1)
    record_start(run, env)
    b = budget(run, env)
    assert (b.others, b.progress) == (1, False)
    ok, why = decide("time_limit", b)
    assert not ok and "requeued 1 times already without progress" in why, why
    check_budget(b)  # one past the cap is what Slurm may still have done: refused from two on
    env = ledger_env(tmp_path, 2)
    record_start(run, env)
    with pytest.raises(LaunchError, match="restarted 2 times without progress"):
        check_budget(budget(run, env))


def test_an_outside_requeue_after_progress_spends_nothing_and_a_start_that_never_reached_rank_0_does(tmp_path):
    """Attempt 0 checkpointed, then an admin's `scontrol requeue` (no record of rank 0 says why): attempt 1
    starts from a newer checkpoint, so attempt 0 spent nothing. Attempt 1 died before rank 0 wrote its
    line (a node lost at start): it counts; attempt 2 starts from the same checkpoint as attempt 1 would have."""
    starts = {0: "-", 2: "step-10.pt"}
    assert stalled(starts, 1, "step-10.pt", set()) == 0
    assert stalled(starts, 2, "step-10.pt", set()) == 1  # attempt 1: no line
    assert stalled({0: "-", 1: "-"}, 2, "-", set()) == 2
    assert stalled({0: "-", 1: "-"}, 2, "-", {0, 1}) == 0  # preemptions have their own cap
    assert stalled({0: "step-4.pt", 1: "step-8.pt", 2: "step-8.pt"}, 2, "step-9.pt", set()) == 1


def test_record_start_keeps_the_first_line_of_an_attempt(tmp_path):
    """An in-job restart (same SLURM_RESTART_COUNT) or the shell's line before rank 0's: the first stands."""
    run = tmp_path / "run"
    env = ledger_env(tmp_path, 3)
    ledger = tmp_path / ".hpctrain" / "progress-9"
    ledger.write_text(f"3\tstep-5.pt\t{run / 'checkpoints'}\n")
    checkpoint(run, 7)
    record_start(run, env)
    assert read_starts(ledger) == {3: "step-5.pt"} and budget(run, env).progress
    record_start(run, {**env, "SLURM_RESTART_COUNT": "4"})
    assert ledger.read_text().splitlines()[-1] == f"4\tstep-7.pt\t{(run / 'checkpoints').resolve()}"
    assert budget(run, {"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "4"}).stalled is None  # no ledger: as before


SHELL = Path(__file__).resolve().parents[2] / "src" / "hpctrain" / "launch" / "shell"


@pytest.mark.parametrize(
    "lines, restart, preempted",
    [
        (["0\t-", "1\tstep-10.pt", "2\tstep-20.pt"], 2, ""),
        (["0\tstep-10.pt", "1\tstep-10.pt", "2\tstep-10.pt"], 2, ""),
        (["0\t-", "2\tstep-10.pt"], 2, ""),
        (["0\t-", "1\t-", "2\t-", "3\t-"], 3, "1\n2\n"),
        (["0\tstep-3.pt", "1\tstep-3.pt"], 1, ""),
    ],
)
def test_the_batch_shell_counts_the_attempts_without_progress_as_rank_0_does(tmp_path, lines, restart, preempted):
    """progress.sh's hpctrain_stalled and budget_left (the shell's own requeues, the guard) against
    run.requeue on the same ledger: the same count, and the same "this attempt made progress"."""
    run = tmp_path / "run"
    checkpoint(run, 20)
    ckpts = run / "checkpoints"
    env = ledger_env(tmp_path, restart)
    ctl = Path(env["HPCTRAIN_CONTROL_DIR"])
    (ctl / "progress-9").write_text("".join(f"{line}\t{ckpts}\n" for line in lines))
    (ctl / "preempted-9").write_text(preempted)
    b = budget(run, env)
    script = (
        f"hpctrain_job=9; . {SHELL / 'progress.sh'}; hpctrain_setup_progress; "
        'hpctrain_budget_left() { :; }; eval "$(sed -n "/^hpctrain_budget_left()/,/^}/p" '
        f'{SHELL / "stops.sh"})"; '
        'echo "$(hpctrain_stalled "$(hpctrain_ckpt_latest)")"; '
        'if hpctrain_budget_left; then echo left; else echo "spent: $hpctrain_budget_why"; fi'
    )
    r = subprocess.run(["bash", "-c", script], env={**env, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    count, verdict = r.stdout.splitlines()
    assert int(count) == b.stalled, (r.stdout, b)
    assert (verdict == "left") == (b.progress or b.others < b.max_requeues), (r.stdout, b)


def test_max_requeues_0_turns_requeues_off_even_after_progress():
    """slurm.max_requeues=0 renders `#SBATCH --no-requeue`, which Slurm holds to: a requeue would be
    refused, so a stop that checkpointed ends the job (and the shell says why) as before."""
    b = Budget("3", 0, 0, 0, -1, stalled=0, progress=True)
    ok, why = decide("time_limit", b)
    assert not ok and "max_requeues=0" in why
    assert not decide("exclude", b)[0]

"""Following a Slurm job at a bounded cost to the controller (watch/follow.py): the pace of the asks,
the files first, requeues, `logs -f`, and the --poll floor. Slurm's answers are a fake `ask` that
counts (and the real cluster's, counted by logging stand-ins for its clients); time is a fake clock."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from hpctrain.cli import main as cli_main
from hpctrain.site import slurm_cli
from hpctrain.watch import logs
from hpctrain.watch.follow import FLOOR_S, Endings, JobEnd, Moved, Pace, pace_of, queue_now
from hpctrain.watch.progress import MetricsTail
from tests.launch.jobs import digits_sets, hp
from tests.site_users import LOGIN_PATH


class Clock:
    """A fake monotonic clock; `sleep` advances it and runs `each` (what the job writes meanwhile)."""

    def __init__(self, each=lambda t: None):
        self.t, self.each = 0.0, each

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s
        self.each(self.t)


class FakeSqueue:
    """`ask` as squeue answers for one job: `states(t)` is its state at time t ("" : it left the
    queue; None: the controller does not answer). Each call is logged with its time."""

    def __init__(self, clock: Clock, states):
        self.clock, self.states, self.calls = clock, states, []

    def __call__(self, *cmd, **kw):
        assert cmd[:3] == ("squeue", "-h", "-j"), cmd  # our job only, one line
        self.calls.append(self.clock())
        st = self.states(self.clock())
        if st is None:
            return None, "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
        return (f"{st}\n" if st else ""), ""


def run_until_ended(end: JobEnd, clock: Clock, tick_s: float = 1.0, cap_s: float = 3600) -> float:
    while not end():
        clock.sleep(tick_s)
        assert clock() < cap_s, "the wait never ended"
    return clock()


def test_the_default_pace_starts_short_and_backs_off_to_a_minute():
    pace = Pace()
    assert pace.due_times(180) == [5, 15, 30, 90, 150]  # docs/launch.md, "Following a job"
    assert all(pace.gap(n) >= 30 for n in range(3, 50))
    # over a 3-minute job with nothing to read in its files: the asks, and the one read of its end
    assert len(pace.due_times(180)) + 1 <= 2 * 3
    assert pace_of(None) == pace and pace_of(7.5) == Pace((), 7.5) and pace_of(7.5).due_times(30) == [7.5, 15, 22.5, 30]


def test_a_silent_3_minute_job_costs_at_most_2_calls_a_minute(monkeypatch):
    """No file moves (a job that writes nothing): squeue at the pace's times only, sacct once at the end."""
    clock = Clock()
    squeue = FakeSqueue(clock, lambda t: "PENDING" if t < 20 else "RUNNING" if t < 180 else "")
    monkeypatch.setattr(slurm_cli, "ask", squeue)
    finals = []
    end = JobEnd("42", lambda: finals.append(clock()) or "COMPLETED", clock=clock)
    done_at = run_until_ended(end, clock)
    assert squeue.calls == [5, 15, 30, 90, 150, 210]  # the first answer after the end: 30 s late at most
    assert finals == [210] and end.state == "COMPLETED" and end.asks == 6
    assert len(squeue.calls) + len(finals) <= 2 * done_at / 60


def test_files_that_grow_spare_the_asks_and_an_end_record_asks_soon(tmp_path, monkeypatch):
    """A job whose metrics grow every 2 s is alive: no ask while they do; its `end` record makes
    the next ask come 5 s later, not at the next minute."""
    metrics = tmp_path / "metrics.jsonl"

    def write(t: float) -> None:
        if 2 <= t <= 170 and int(t) % 2 == 0:
            with metrics.open("a") as f:
                f.write(json.dumps({"kind": "train", "step": int(t), "time": t}) + "\n")
        if t == 171:
            with metrics.open("a") as f:
                f.write(json.dumps({"kind": "end", "status": "finished", "time": t}) + "\n")

    clock = Clock(write)
    squeue = FakeSqueue(clock, lambda t: "RUNNING" if t < 174 else "")
    monkeypatch.setattr(slurm_cli, "ask", squeue)
    end = JobEnd(
        "42",
        lambda: "COMPLETED",
        moved=Moved([metrics]),
        endings=Endings(MetricsTail(metrics, clock=clock)),
        clock=clock,
    )
    run_until_ended(end, clock)
    assert squeue.calls == [176]  # none while the records came (5, 15, 30, 90, 150 skipped); end record + 5 s


def test_a_requeue_keeps_the_wait_going_to_the_end(monkeypatch):
    """RUNNING, back to PENDING (requeued), RUNNING again, then out of the queue; and accounting
    that lags the controller (sacct still RUNNING once): the wait ends only at a final state."""
    clock = Clock()
    states = lambda t: "RUNNING" if t < 100 else "PENDING" if t < 160 else "RUNNING" if t < 400 else ""  # noqa: E731
    squeue = FakeSqueue(clock, states)
    monkeypatch.setattr(slurm_cli, "ask", squeue)
    finals = iter(["RUNNING", "COMPLETED"])
    end = JobEnd("42", lambda: next(finals), clock=clock)
    seen = []
    while not end():
        if end.state and (not seen or seen[-1] != end.state):
            seen.append(end.state)
        clock.sleep(1.0)
    assert seen == ["RUNNING", "PENDING", "RUNNING"] and end.state == "COMPLETED"
    assert clock() >= 400 and squeue.calls[-2] >= 400  # sacct's late RUNNING: asked again 5 s later


def test_no_answer_from_the_controller_keeps_the_wait_going(monkeypatch):
    clock = Clock()
    squeue = FakeSqueue(clock, lambda t: None if t < 100 else "")
    monkeypatch.setattr(slurm_cli, "ask", squeue)
    end = JobEnd("42", lambda: "FAILED", clock=clock)
    assert run_until_ended(end, clock) >= 100 and end.state == "FAILED"
    assert squeue.calls == [5, 15, 30, 90, 150]


def test_a_job_no_one_knows_any_more_ends_the_wait(monkeypatch):
    """logs -f of a job that ended long ago on a cluster without accounting: squeue has forgotten
    it, sacct cannot answer, scontrol no longer holds it: UNKNOWN ends the wait (it never comes back)."""
    clock = Clock()
    squeue = FakeSqueue(clock, lambda t: "")
    monkeypatch.setattr(slurm_cli, "ask", squeue)
    end = JobEnd("42", lambda: "UNKNOWN", clock=clock, at_once=True)
    assert end() and end.state == "UNKNOWN" and squeue.calls == [0]


def test_queue_now_reads_squeue_as_22_05_answers(monkeypatch):
    answers = {
        "1": ("RUNNING\n", ""),
        "2": ("", ""),  # ended, still held by slurmctld (MinJobAge)
        "3": (None, "slurm_load_jobs error: Invalid job id specified"),  # forgotten
        "4": (None, "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"),
    }
    monkeypatch.setattr(slurm_cli, "ask", lambda *cmd, **kw: answers[cmd[3]])
    assert [queue_now(j) for j in "1234"] == ["RUNNING", "", "", None]


def test_logs_f_asks_slurm_only_when_the_log_stops_growing(tmp_path, monkeypatch):
    """`logs -f` of a Slurm job (has_ended + follow): one ask at the start (the job may have ended
    long ago), none while the log grows, then at the pace until the job has left the queue."""
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "job.json").write_text(json.dumps({"job_id": "42", "executor": "slurm"}))
    log = run / "logs" / "rank-0.log"
    written = []

    def write(t: float) -> None:
        if t <= 100 and t == int(t):
            with log.open("a") as f:
                f.write(f"step at {t:.0f}\n")
            written.append(f"step at {t:.0f}\n")

    clock = Clock(write)
    squeue = FakeSqueue(clock, lambda t: "RUNNING" if t < 130 else "")
    monkeypatch.setattr(slurm_cli, "ask", squeue)
    monkeypatch.setattr(logs, "job_state", lambda job_id, where=None: "COMPLETED")
    out = io.StringIO()
    ended = logs.has_ended(run, "42", "slurm", log, clock=clock)
    logs.follow(log, ended, poll_s=0.5, out=out, clock=clock, sleep=clock.sleep)
    assert out.getvalue() == "".join(written) and written
    assert squeue.calls[0] == 0 and all(t > 100 for t in squeue.calls[1:]), squeue.calls
    assert squeue.calls[-1] >= 130 and len(squeue.calls) <= 4, squeue.calls


@pytest.mark.parametrize(
    "argv, follows",
    [
        (["logs", "runs/x", "-f", "--poll", "2"], "-f"),
        (["submit", "--wait", "--poll", "4.9"], "--wait"),
        (["eval", "--weights", "w.pt", "--config", "digits_vit", "--nodes", "1", "--wait", "--poll", "1"], "--wait"),
    ],
)
def test_poll_below_the_floor_is_one_line_naming_it(argv, follows, capsys):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"below the floor of {FLOOR_S:g} s" in err[0] and f"give --poll {FLOOR_S:g}" in err[0]


def test_poll_without_following_is_one_line(capsys):
    assert cli_main(["logs", "runs/x", "--poll", "10"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "hpctrain: error: --poll sets how often -f asks Slurm: add -f, or drop --poll"


def counting_clients(cluster, d: Path, log: Path) -> dict[str, str]:
    """Stand-ins for the Slurm clients, first on PATH, that append `<time> <command> <args>` to `log`
    and exec the cluster's real one; the batch shell's calls (SLURM_JOB_ID set) are not counted. In
    `d`, which the test cluster's users can reach; the environment that puts them first."""
    d.mkdir()
    path = cluster.environ()["PATH"]
    for name in (*CALLS, "sbatch"):
        real = shutil.which(name, path=path)
        w = d / name
        w.write_text(
            f'#!/bin/sh\n[ -n "$SLURM_JOB_ID" ] || printf "%s %s %s\\n" "$(date +%s.%N)" {name} "$*" >> {log}\n'
            f'exec {real} "$@"\n'
        )
        w.chmod(0o755)
    return {"PATH": f"{d}{os.pathsep}{LOGIN_PATH}"}


CALLS = ("squeue", "sacct", "scontrol", "sinfo", "sacctmgr", "scancel")  # what a follower could call
STEPS, STEP_DELAY_S = 60, 2.5  # a job of ~3 minutes: 60 steps slowed by 2.5 s each, one CPU task


@pytest.mark.slurm
@pytest.mark.slow
def test_submit_wait_of_a_3_minute_job_costs_at_most_2_slurm_calls_a_minute(slurm_cluster, digits_root, tmp_path):
    """The issue's budget, counted on the real cluster with logging stand-ins for the clients: from
    the sbatch to the end of `submit --wait` (its status table included), at most 2 calls a minute,
    each about our job only (before: sacct every 2 s, 30 a minute)."""
    log = tmp_path / "calls.log"
    env = counting_clients(slurm_cluster, tmp_path / "bin", log)
    env["HPCTRAIN_TEST_DELAY"] = f"0:{STEP_DELAY_S}:data"
    sets = digits_sets(digits_root, tmp_path, "three", f"train.max_steps={STEPS}", "log.every=1")
    sets += ["--set", "train.eval_every_epochs=0"]
    args = ["submit", "--config", "configs/digits_vit.yaml", "--nodes", "1", "--gpus-per-node", "1", "--wait"]
    r = hp(slurm_cluster, *args, *sets, env=env, timeout=900)
    done = time.time()
    assert r.returncode == 0 and "COMPLETED" in r.stdout, r.stdout + r.stderr
    job = re.search(r"submitted Slurm job (\d+)", r.stdout).group(1)
    calls = [line.split(" ", 2) for line in log.read_text().splitlines()]
    sbatch = max(float(t) for t, kind, a in calls if kind == "sbatch" and "--version" not in a)  # the submission
    waiting = [(float(t) - sbatch, kind, a) for t, kind, a in calls if float(t) > sbatch and kind in CALLS]
    minutes = (done - sbatch) / 60
    assert minutes >= STEPS * STEP_DELAY_S / 60, minutes  # the job was the 3-minute one
    assert len(waiting) <= 2 * minutes, (minutes, waiting)
    assert all(f"-j {job}" in a for _, _, a in waiting), waiting  # our job only
    print(f"submit --wait of a {minutes:.1f}-minute job: {len(waiting)} Slurm calls while it waited: {waiting}")
    # `logs -f` of the ended job: the log at once, and its end from one squeue and one sacct
    before = len(log.read_text().splitlines())
    f = hp(slurm_cluster, "logs", job, "-f", env=env)
    assert f.returncode == 0 and "rank 0 on host n1" in f.stdout, f.stdout + f.stderr
    asked = [line.split(" ", 2)[1] for line in log.read_text().splitlines()[before:]]
    assert asked.count("squeue") == 1 and asked.count("sacct") <= 3, asked  # + resolve's sacct of the id
    # `eval --wait` of its weights as a job: the summary, its calls about its own job only
    before = len(log.read_text().splitlines())
    ev = hp(slurm_cluster, "eval", str(tmp_path / "three"), "--nodes", "1", "--gpus-per-node", "1", "--wait", env=env)
    ev_done = time.time()
    assert ev.returncode == 0 and "top-1" in ev.stdout, ev.stdout + ev.stderr
    ev_job = re.search(r"submitted Slurm job (\d+)", ev.stdout).group(1)
    lines = [line.split(" ", 2) for line in log.read_text().splitlines()[before:]]
    start = max(float(t) for t, kind, a in lines if kind == "sbatch" and "--version" not in a)
    after = [(kind, a) for t, kind, a in lines if float(t) > start and kind in CALLS]
    # the same budget: at most 2 a minute, and the first asks (5, 15, 30 s) of a short job; a busy
    # machine that slows the eval job lengthens the wait, not the rate
    ev_minutes = (ev_done - start) / 60
    assert after and all(f"-j {ev_job}" in a for _, a in after), after
    assert len(after) <= max(6, 2 * ev_minutes), (ev_minutes, after)

"""The tasks' own clock for the time limit (train.stop.deadline_from): Slurm's USR2 can be lost (sent
while the batch shell started a new step, or forwarded before a slow container's tasks were up:
Slurm drops it then), so a task whose job has SLURM_JOB_END_TIME (Slurm >= 23.02) stops as for a
time limit once less than the batch script's signal lead (HPCTRAIN_SIGNAL_LEAD_S) is left."""

from __future__ import annotations

import signal
import time

from hpctrain.run.metrics import read_metrics
from hpctrain.train import stop
from tests.helpers import digits_args, run_ranks


def test_the_deadline_is_the_jobs_end_less_the_signal_lead():
    assert stop.deadline_from({"SLURM_JOB_END_TIME": "1800000000", "HPCTRAIN_SIGNAL_LEAD_S": "180"}) == 1799999820
    assert stop.deadline_from({"SLURM_JOB_END_TIME": "1800000000"}) is None  # not our batch script
    assert stop.deadline_from({"HPCTRAIN_SIGNAL_LEAD_S": "180"}) is None  # Slurm < 23.02, or no job
    assert stop.deadline_from({"SLURM_JOB_END_TIME": "0", "HPCTRAIN_SIGNAL_LEAD_S": "180"}) is None


def test_a_passed_deadline_raises_one_time_limit_stop_unless_a_signal_came():
    flag = stop.StopFlag()
    flag.deadline = time.time() + 3600
    assert flag.bits() == 0 and not flag()
    flag.deadline = time.time() - 1
    assert flag.bits() == stop.BITS["time_limit"] and flag() and flag.kind == "time_limit"
    assert len(flag.received) == 1 and flag.bits() == stop.BITS["time_limit"]  # once
    pre = stop.StopFlag()
    pre.deadline = time.time() - 1
    pre.handler(signal.SIGTERM, None)  # a preemption came first: it stays one
    assert pre.bits() == stop.BITS["preemption"] and len(pre.received) == 1


def test_a_run_whose_usr2_never_came_stops_at_its_jobs_end_as_for_a_time_limit(digits_root, tmp_path):
    """A run with no signal at all, in a job that ends 20 s after its start less the lead: it
    checkpoints and stops with a time_limit stop record before its last step."""
    lead = 600
    env = {
        "SLURM_JOB_END_TIME": str(int(time.time()) + lead + 20),
        "HPCTRAIN_SIGNAL_LEAD_S": str(lead),
        "HPCTRAIN_TEST_DELAY": "0:0.5:data",  # ≥ 22 s of steps: the clock strikes mid-run
    }
    (r,) = run_ranks(1, digits_args(digits_root, tmp_path, "clock", "train.max_steps=44"), env=env, check=False)
    recs = read_metrics(tmp_path / "clock" / "metrics.jsonl")
    stops = [x for x in recs if x["kind"] == "stop"]
    assert len(stops) == 1 and stops[0]["stop_kind"] == "time_limit" and stops[0]["step"] < 44, (
        stops,
        r.stderr[-3000:],
    )
    assert "no stop signal came" in r.stdout + r.stderr, r.stdout[-3000:]


def test_the_batch_shells_end_file_moves_the_stop_and_only_its_stop_word_raises_it(tmp_path, monkeypatch):
    """Under the hpctrain batch script the clock is HPCTRAIN_END_FILE (launch/shell/clock.sh): an end
    long past SLURM_JOB_END_TIME's (a TimeLimit extension) raises nothing; the file is read again only
    once it changed, and the stop comes when the shell, having asked Slurm, writes `stop`."""
    end_file = tmp_path / "end-5"
    end_file.write_text(f"{int(time.time()) + 3600}\n")
    monkeypatch.setenv("HPCTRAIN_END_FILE", str(end_file))
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(time.time()) - 60))  # the end at the start: passed
    monkeypatch.setenv("HPCTRAIN_SIGNAL_LEAD_S", "180")
    monkeypatch.setattr(stop, "END_FILE_POLL_S", 0.0)
    monkeypatch.setattr(stop.signal, "signal", lambda *a: None)  # no handlers taken from pytest
    flag = stop.StopFlag().install()
    assert flag.bits() == 0 and flag.end_file.end == int(end_file.read_text())
    moved = int(time.time()) + 7200
    tmp = tmp_path / "end-5.tmp"  # as the shell writes it: a new file renamed over the old
    tmp.write_text(f"{moved}\n")
    tmp.replace(end_file)
    assert flag.bits() == 0 and flag.end_file.end == moved
    tmp.write_text(f"{moved} stop\n")
    tmp.replace(end_file)
    assert flag.bits() == stop.BITS["time_limit"] and flag.kind == "time_limit" and len(flag.received) == 1


def test_the_end_file_is_stated_at_most_once_a_second(tmp_path, monkeypatch):
    end_file = tmp_path / "end-5"
    end_file.write_text("1800000000\n")
    clock = stop.EndFile(str(end_file))
    assert not clock.poll() and clock.end == 1800000000
    end_file.write_text("1800000000 stop\n")
    calls = []
    real = stop.os.stat
    monkeypatch.setattr(stop.os, "stat", lambda p: calls.append(p) or real(p))
    assert not clock.poll() and calls == []  # within END_FILE_POLL_S of the last look: not even a stat

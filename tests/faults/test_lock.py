"""Two jobs pointed at one run directory: the second refuses to start, the first is unharmed; a
file system that refuses locks, and a stale lock of the same Slurm job after a node failure."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.local import last_step, start_ranks, wait_for_step
from tests.helpers import digits_args


@pytest.mark.slow
def test_second_job_refused_first_unharmed(digits_root, tmp_path):
    first = start_ranks(1, digits_root, tmp_path, "shared", "train.max_steps=60")
    run = tmp_path / "shared"
    wait_for_step(run, 3, first)
    config_before = (run / "config.yaml").read_bytes()
    r = subprocess.run(
        [sys.executable, *digits_args(digits_root, tmp_path, "shared", "train.max_steps=60", "optim.lr=0.5")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert f"run directory {run} is in use by" in r.stderr and f'"pid": {first[0].pid}' in r.stderr
    assert (run / "config.yaml").read_bytes() == config_before
    step = last_step(run)
    out, _ = first[0].communicate(timeout=300)
    assert first[0].returncode == 0, out[-2000:]
    assert last_step(run) == 60 > step and re.search(r"status +finished", out)
    # the lock dies with its holder: a later job may take the directory over (and train it further:
    # a finished run is not trained again)
    r = subprocess.run(
        [sys.executable, *digits_args(digits_root, tmp_path, "shared", "train.max_steps=70")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert last_step(run) == 70


# --- shared file systems -------------------------------------------------------------------------

NOLOCKFS = Path(__file__).with_name("nolockfs.py")
LOCKER = """
import json, sys
from hpctrain.run.rundir import RunLock
lock = RunLock(sys.argv[1])
holder = lock.acquire()
print(json.dumps({"holder": holder, "note": getattr(lock, "note", None)}), flush=True)
if holder is None:
    sys.stdin.read()  # hold the lock until the test closes stdin
"""


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any Slurm job in it, plus `extra`."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}, **extra}


class Locker:
    """A live process that tries RunLock on a run directory and, if it gets it, holds it."""

    def __init__(self, run: Path, **env: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LOCKER, str(run)],
            env=clean_env(**env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        assert line, f"the locker died: rc {self.proc.wait(timeout=30)}"
        r = json.loads(line)
        self.holder, self.note = r["holder"], r["note"]
        if self.holder is not None:  # refused: it has exited
            self.close()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def nolockfs_skip() -> None:
    from tests.faults.nolockfs import unavailable

    why = unavailable()
    if why:
        pytest.skip(why)


@pytest.mark.parametrize("refusal", ["ENOLCK", "ENOSYS", "EOPNOTSUPP"])
def test_lock_refused_by_the_file_system_goes_on_and_says_why(tmp_path, refusal):
    """lockf on a file system that refuses locks (a FUSE file system answering every lock request
    with ENOLCK as NFS without lockd does, ENOSYS as Lustre noflock does, or EOPNOTSUPP): the lock is
    not had, the job is not refused, the note names the risk, the holder record is written."""
    nolockfs_skip()
    run = tmp_path / "run"
    run.mkdir()
    r = subprocess.run(
        [
            sys.executable,
            str(NOLOCKFS),
            "--errno",
            refusal,
            str(run / ".lock"),
            "--",
            sys.executable,
            "-c",
            LOCKER,
            str(run),
        ],
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"1 lock request(s) refused with {refusal}" in r.stderr  # lockf reached the file system
    out = json.loads(r.stdout)
    assert out["holder"] is None
    assert "refuses locks" in out["note"] and "both would write it" in out["note"]
    assert json.loads((run / ".lock").read_text())["host"] == socket.gethostname()


@pytest.mark.slow
def test_job_on_a_file_system_without_locks_trains_and_warns_once(digits_root, tmp_path):
    """A whole training job whose run directory's lock file refuses locks (ENOLCK): it trains to
    the end, and its rank log says once that a second job would not be refused."""
    nolockfs_skip()
    run = tmp_path / "nolocks"
    run.mkdir()
    r = subprocess.run(
        [
            sys.executable,
            str(NOLOCKFS),
            "--errno",
            "ENOLCK",
            str(run / ".lock"),
            "--",
            sys.executable,
            *digits_args(digits_root, tmp_path, "nolocks", "train.max_steps=4"),
        ],
        env=clean_env(OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "1 lock request(s) refused with ENOLCK" in r.stderr
    assert re.search(r"status +finished", r.stdout + r.stderr)
    log = (run / "logs" / "rank-0.log").read_text()
    warned = [ln for ln in log.splitlines() if "refuses locks" in ln]
    assert len(warned) == 1 and "WARNING" in warned[0] and "both would write it" in warned[0], log[-2000:]


def test_requeued_run_of_the_same_job_takes_over_its_stale_lock(tmp_path):
    """After a NODE_FAIL a lock server can keep the dead run's lock: the holder here is a live
    process of job 77 (as the lock server would be), never released. Job 77's next run (restart 1)
    takes it over; another job, or a second writer of the same run of job 77, is still refused."""
    run = tmp_path / "run"
    run.mkdir()
    stale = Locker(run, SLURM_JOB_ID="77")
    assert stale.holder is None
    try:
        other = Locker(run, SLURM_JOB_ID="78")
        assert '"slurm_job": "77"' in other.holder
        same_run = Locker(run, SLURM_JOB_ID="77")  # no restart: another step of the same run
        assert '"slurm_job": "77"' in same_run.holder
        requeued = Locker(run, SLURM_JOB_ID="77", SLURM_RESTART_COUNT="1")
        assert requeued.holder is None, requeued.holder
        assert "took over the lock held by this job's earlier run" in requeued.note
        assert f'"pid": {stale.proc.pid}' in requeued.note and stale.proc.poll() is None
        rec = json.loads((run / ".lock").read_text())
        assert rec["pid"] == requeued.proc.pid and rec["slurm_job"] == "77" and rec["slurm_restart"] == 1
        assert sorted(p.name for p in run.iterdir()) == [".lock"]
        # the new holder is protected like any other: another job, or a second writer of restart 1
        assert f'"pid": {requeued.proc.pid}' in Locker(run, SLURM_JOB_ID="78").holder
        assert f'"pid": {requeued.proc.pid}' in Locker(run, SLURM_JOB_ID="77", SLURM_RESTART_COUNT="1").holder
        requeued.close()
        later = Locker(run, SLURM_JOB_ID="78")  # its lock died with it; the stale one stays on the old file
        assert later.holder is None
        later.close()
    finally:
        stale.close()


def test_a_later_attempt_of_the_same_job_run_takes_a_stale_lock_over():
    """A step restarted on spare nodes (same job, same restart count, higher HPCTRAIN_ATTEMPT) is the
    failed step's successor, like a requeued run; the same attempt is a second writer."""
    from hpctrain.run.rundir import earlier_run_of_this_job

    held = {"slurm_job": "7", "slurm_restart": 0, "attempt": 0}
    assert earlier_run_of_this_job(held, {"slurm_job": "7", "slurm_restart": 0, "attempt": 1})
    assert earlier_run_of_this_job({"slurm_job": "7", "slurm_restart": 0}, {"slurm_job": "7", "slurm_restart": 1})
    assert not earlier_run_of_this_job(held, {"slurm_job": "7", "slurm_restart": 0, "attempt": 0})
    assert not earlier_run_of_this_job({**held, "attempt": 2}, {"slurm_job": "7", "slurm_restart": 0, "attempt": 1})
    assert not earlier_run_of_this_job(held, {"slurm_job": "8", "slurm_restart": 0, "attempt": 1})

"""A run directory whose file server stops answering (tests/faults/stallfs.py, stopped with
SIGSTOP, as a Lustre or NFS server that stalls): every write into it waits, unanswered, in the
kernel. The ranks wait with it; the hang watchdog waits the stall out instead of calling it a
hang, and the run goes on when the directory answers again."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from hpctrain.train.health.watchdog import FS_STALL
from tests.faults.local import last_step, start_ranks, wait_for_step
from tests.faults.nolockfs import unavailable
from tests.helpers import ROOT, run_metrics

STALLFS = Path(__file__).with_name("stallfs.py")
HANG = 5  # health.hang_timeout_s: the stall below lasts several of these
STALL = 25  # seconds the file server is stopped
STEPS = 30


def stop_all(procs, sig: int) -> None:
    for p in procs:
        os.kill(p.pid, sig)


@pytest.mark.slow
def test_a_frozen_run_directory_is_waited_out_not_called_a_hang(digits_root, tmp_path):
    why = unavailable()
    if why:
        pytest.skip(why)
    runs = tmp_path / "runs"
    runs.mkdir()
    run = runs / "stall"
    procs = start_ranks(
        4,
        digits_root,
        runs,
        "stall",
        f"train.max_steps={STEPS}",
        "data.global_batch=48",
        f"health.hang_timeout_s={HANG}",
        "dist.pg_timeout_s=300",  # the collectives outwait the stall; the watchdog is what is tested
        env={"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},  # for stallfs.py
        prefix=(sys.executable, str(STALLFS), str(runs), "--"),
    )
    try:
        wait_for_step(run, 5, procs)
        stop_all(procs, signal.SIGSTOP)  # every rank's file server: the whole run directory stalls
        before = last_step(run)
        time.sleep(STALL)  # the fault itself: how long the server does not answer
        during = last_step(run) - before
        stop_all(procs, signal.SIGCONT)
        outs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:  # a reaped wrapper's pid may be another process's by now
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGCONT)
                    os.killpg(p.pid, signal.SIGKILL)
    tails = "\n".join(f"--- rank {r}\n{o[-3000:]}" for r, o in enumerate(outs))
    assert during <= 2, f"the run went on {during} steps while its directory was frozen: no stall\n{tails}"
    assert [p.returncode for p in procs] == [0, 0, 0, 0], tails
    assert "hang: no step completed" not in tails, tails
    assert "a file-system stall, not a hang" in outs[0], tails
    stalls = run_metrics(run, FS_STALL)
    assert len(stalls) == 1 and stalls[0]["seconds"] >= STALL / 2 and stalls[0]["rank"] == 0, stalls
    assert not run_metrics(run, "hang")
    assert last_step(run) == STEPS

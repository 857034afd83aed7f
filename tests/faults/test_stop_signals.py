"""Stop signals as Slurm sends them, to local gloo ranks: SIGTERM (preemption) and USR2 (time
limit) both stop at a step boundary; the kind is agreed even when one rank alone was signalled;
a signal during start-up (before the rendezvous) ends every rank cleanly, not by the signal."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.faults.local import start_ranks, wait_for_step
from tests.helpers import run_metrics

SETS = ["train.max_steps=40"]


def handlers_installed(pid: int, *sigs: int) -> bool:
    """The process has a handler for every one of `sigs` (SigCgt in /proc/<pid>/status)."""
    try:
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    mask = int(line.split()[1], 16)
    return all(mask >> (s - 1) & 1 for s in sigs)


def finish(procs, timeout: float = 180) -> list[str]:
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, f"rank exited {p.returncode}:\n{out[-3000:]}"
    return outs


@pytest.mark.slow
def test_sigterm_during_startup_stops_every_rank_cleanly(digits_root, tmp_path):
    """SIGTERM to both ranks as soon as their handlers exist (before torch, the rendezvous and the
    model): they meet, agree to stop before the first step, and exit 0 with a stop record."""
    procs = start_ranks(2, digits_root, tmp_path, "early", *SETS)
    deadline = time.monotonic() + 60
    while not all(handlers_installed(p.pid, signal.SIGTERM, signal.SIGUSR2) for p in procs):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "handlers never installed"
        time.sleep(0.01)
    for p in procs:
        os.kill(p.pid, signal.SIGTERM)
    outs = finish(procs)
    recs = run_metrics(tmp_path / "early")
    assert [r["kind"] for r in recs] == ["stop"], recs
    assert recs[0]["step"] == 0 and recs[0]["stop_kind"] == "preemption"
    for rank in (0, 1):
        assert "received SIGTERM" in (tmp_path / "early" / "logs" / f"rank-{rank}.log").read_text()
    assert "stopped at step 0 (preemption)" in outs[0]


@pytest.mark.slow
@pytest.mark.parametrize("sig, kind", [(signal.SIGTERM, "preemption"), (signal.SIGUSR2, "time_limit")])
def test_one_signalled_rank_stops_all_with_its_kind(sig, kind, digits_root, tmp_path):
    """Only rank 1 gets the signal; rank 0, which records the stop and decides about the requeue,
    learns its kind through the agreement."""
    run = tmp_path / "one"
    procs = start_ranks(2, digits_root, tmp_path, "one", *SETS)
    wait_for_step(run, 3, procs)
    os.kill(procs[1].pid, sig)
    finish(procs)
    stops = run_metrics(run, "stop")
    assert len(stops) == 1 and stops[0]["stop_kind"] == kind and 3 <= stops[0]["step"] < 40
    assert [r["step"] for r in run_metrics(run, "checkpoint")] == [stops[0]["step"]]
    assert f"received {signal.Signals(sig).name}" in (run / "logs" / "rank-1.log").read_text()
    assert f"received {signal.Signals(sig).name}" not in (run / "logs" / "rank-0.log").read_text()


@pytest.mark.slow
def test_ctrl_c_of_train_checkpoints_at_the_stop_step_and_exits_130(digits_root, tmp_path):
    """SIGINT (a terminal's Ctrl-C) to `hpctrain train`: a stop at the next step of kind
    `interrupt`, its checkpoint and stop record, then exit 130 (not a KeyboardInterrupt)."""
    run = tmp_path / "int"
    (proc,) = start_ranks(1, digits_root, tmp_path, "int", *SETS)
    wait_for_step(run, 3, [proc])
    os.kill(proc.pid, signal.SIGINT)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, out[-3000:]
    (stop,) = run_metrics(run, "stop")
    assert stop["stop_kind"] == "interrupt" and 3 <= stop["step"] < 40, stop
    assert [r["step"] for r in run_metrics(run, "checkpoint")] == [stop["step"]]
    assert f"interrupted: stopped at step {stop['step']}, checkpoint" in out and "Traceback" not in out, out

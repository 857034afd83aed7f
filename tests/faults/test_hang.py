"""A rank that hangs (SIGSTOP).

With the hang watchdog (health.hang_timeout_s, well below dist.pg_timeout_s) the live ranks write
their stacks and name the stopped one; with it off, the others give up within the process-group
timeout and name it through the rendezvous store.
"""

from __future__ import annotations

import os
import signal

import pytest

from hpctrain.train.health.watchdog import NO_STACK, top_frame
from tests.faults.local import start_ranks, wait_for_step
from tests.helpers import run_metrics

HANG = 5
PG_TIMEOUT = 8


@pytest.mark.slow
def test_watchdog_names_the_stopped_rank_and_the_others_write_their_stacks(digits_root, tmp_path):
    run, pg = tmp_path / "hang3", 6 * HANG  # the collectives would time out long after the watchdog
    procs = start_ranks(
        3,
        digits_root,
        tmp_path,
        "hang3",
        "train.max_steps=400",
        "data.global_batch=48",
        f"health.hang_timeout_s={HANG}",
        f"dist.pg_timeout_s={pg}",
    )
    try:
        wait_for_step(run, 3, procs)
        os.kill(procs[1].pid, signal.SIGSTOP)
        outs = {r: procs[r].communicate(timeout=pg + 60)[0] for r in (0, 2)}  # bounded: no hang
    finally:
        for p in procs:
            p.kill()
    logs = run / "logs"
    for r in (0, 2):
        assert procs[r].returncode not in (0, None), outs[r][-3000:]
        stack = (logs / f"stack-rank-{r}.txt").read_text()
        assert 'File "' in stack and top_frame(stack), stack  # the training thread's innermost frame
        lines = [x for x in outs[r].splitlines() if "hang: no step completed" in x]
        assert len(lines) == 1, outs[r][-3000:]
        line = lines[0]
        assert "rank(s) 1 behind step" in line and f"): {NO_STACK}" in line, line  # rank 1 (heartbeat …): no stack
        assert "the other ranks wait at" in line and top_frame(stack) in line, line
        assert "stack-rank-0.txt" in line and "stack-rank-2.txt" in line, line
        assert "stopped responding" not in outs[r]  # the watchdog fired, not the collective timeout
    assert not (logs / "stack-rank-1.txt").exists()
    rec = run_metrics(run, "hang")[-1]
    assert rec["ranks"] == [1] and rec["where"] == [None] and rec["step"] >= 3, rec
    assert sorted(os.path.basename(f) for f in rec["files"]) == ["stack-rank-0.txt", "stack-rank-2.txt"]


@pytest.mark.slow
def test_without_watchdog_the_collective_timeout_names_the_stopped_rank(digits_root, tmp_path):
    procs = start_ranks(
        2,
        digits_root,
        tmp_path,
        "hang",
        "train.max_steps=400",
        f"dist.pg_timeout_s={PG_TIMEOUT}",
        "health.hang_timeout_s=0",
    )
    try:
        wait_for_step(tmp_path / "hang", 3, procs)
        os.kill(procs[1].pid, signal.SIGSTOP)
        out, _ = procs[0].communicate(timeout=PG_TIMEOUT * 2 + 60)  # bounded: no hang
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode != 0
    assert "rank(s) 1 stopped responding" in out, out[-3000:]
    assert not list((tmp_path / "hang" / "logs").glob("stack-rank-*"))

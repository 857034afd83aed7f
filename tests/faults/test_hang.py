"""A rank that hangs (SIGSTOP): the others give up within the process-group timeout and name it."""

from __future__ import annotations

import os
import signal
import time

from tests.faults.local import start_ranks, wait_for_step

PG_TIMEOUT = 8


def test_stopped_rank_is_named_and_job_fails_in_time(digits_root, tmp_path):
    procs = start_ranks(2, digits_root, tmp_path, "hang", "train.max_steps=400", f"train.pg_timeout_s={PG_TIMEOUT}")
    try:
        wait_for_step(tmp_path / "hang", 3, procs)
        os.kill(procs[1].pid, signal.SIGSTOP)
        t0 = time.time()
        out, _ = procs[0].communicate(timeout=PG_TIMEOUT * 2 + 60)
        waited = time.time() - t0
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode != 0
    assert "rank(s) 1 stopped responding" in out, out[-3000:]
    assert waited < PG_TIMEOUT * 2 + 60  # bounded: no hang

"""Start ranks of `hpctrain train` as local processes and watch them, for fault injection."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import WAIT_S, digits_args, free_port, run_metrics, run_report, wait_for


def start_ranks(
    world: int,
    digits_root: Path,
    run_dir: Path,
    name: str,
    *sets: str,
    env: dict | None = None,
    prefix: tuple[str, ...] = (),
) -> list[subprocess.Popen]:
    """`world` ranks of the digits run; `prefix`: a command each rank runs under (a wrapper such as
    stallfs.py, whose process is then the one in the list, in a session of its own)."""
    port = free_port()
    procs = []
    for rank in range(world):
        e = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
        if world > 1:
            e.update(
                RANK=str(rank),
                WORLD_SIZE=str(world),
                LOCAL_RANK=str(rank),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
        procs.append(
            subprocess.Popen(
                [*prefix, sys.executable, *digits_args(digits_root, run_dir, name, *sets)],
                env=e,
                start_new_session=bool(prefix),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


def last_step(run: Path) -> int:
    return max((r.get("step", 0) for r in run_metrics(run)), default=0)


def wait_for_step(run: Path, step: int, procs, timeout: float = 120) -> int:
    """The run's last step once it is at `step` or beyond (waits on the records, for at least
    `timeout` s and WAIT_S); a rank that exits first fails the test with every rank's output."""

    def reached():
        s = last_step(run)
        if s >= step:
            return s
        if any(p.poll() is not None for p in procs):
            raise AssertionError("a rank exited early:\n" + "\n".join(p.communicate()[0][-3000:] for p in procs))
        return None

    return wait_for(
        reached, f"{run} did not reach step {step}", max(timeout, WAIT_S), lambda: run_report(run), poll_s=0.05
    )

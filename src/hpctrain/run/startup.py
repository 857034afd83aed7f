"""When each phase of this process's start-up ended: the `startup` record of the goodput ledger.

A restart or a requeue costs its start-up again (the srun step, imports, the process groups, the
checkpoint, the warm-ups, the first batch): run/goodput.py splits it by these marks, and the restart
test prints them as its phase table. Every mark is wall-clock time (`time.time`): the ledger lines
them up with the batch shell's `date +%s.%N` (HPCTRAIN_STEP_AT: when it ran this step's srun) and
with sacct's times, across nodes. Process-wide state on purpose: the marks are set in four places
(launch.task, train.entry, train.loop) that share nothing else, once per process.
Imports no torch: the task marks `process` and `imports` around importing it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

STEP_AT_ENV = "HPCTRAIN_STEP_AT"  # the batch shell's time before this step's srun (step_start.sh)
# the phases in the order they end; a phase that did not run (no preflight, nothing to resume) has no mark
PHASES = (
    "launched",  # the batch shell started the srun of this step (HPCTRAIN_STEP_AT)
    "process",  # this Python process started (the kernel's start time of the pid)
    "imports",  # torch and the training core imported
    "process_group",  # the default and control process groups formed (rendezvous)
    "preflight",  # the nodes' checks passed (health.preflight)
    "model",  # model, optimizer, loaders and the wrappers built (compile warm-ups included)
    "checkpoint",  # the checkpoint read and loaded
    "warmup",  # the loop's warm-ups done: the first log window starts here
    "first_batch",  # the first batch came out of the loader
    "first_step",  # the first optimizer step done
)
_at: dict[str, float] = {}


def mark(phase: str, at: float | None = None) -> None:
    """`phase` ended now (or at `at`); the first mark of a phase wins (a process starts once)."""
    if phase not in PHASES:
        raise ValueError(f"unknown start-up phase {phase!r}; the phases are {', '.join(PHASES)}")
    _at.setdefault(phase, time.time() if at is None else at)


def process_start() -> float | None:
    """This process's start (Linux: /proc/self/stat's start time in clock ticks after boot), counted
    back from now by /proc/uptime: /proc/stat's btime is whole seconds, which put `process` up to 1 s
    before `launched` in the restart test's table."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, counted after the command name
        now, uptime = time.time(), float(Path("/proc/uptime").read_text().split()[0])
        return now - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def mark_process(env: Mapping[str, str] | None = None) -> None:
    """Mark `launched` (the batch shell's time, where it ran this step) and `process`."""
    env = os.environ if env is None else env
    try:
        launched = float(env.get(STEP_AT_ENV, ""))
        mark("launched", launched)
    except ValueError:
        pass
    started = process_start()
    mark("process", started if started is not None else time.time())


def marks() -> dict[str, float]:
    """The marks so far, in the phases' order."""
    return {p: round(_at[p], 3) for p in PHASES if p in _at}


def record(step: int, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The `startup` record's fields: which attempt of which job started, at which step, when each phase ended."""
    env = os.environ if env is None else env
    return {
        "job": env.get("SLURM_JOB_ID"),
        "slurm_restart": int(env.get("SLURM_RESTART_COUNT", "0") or 0),
        "attempt": int(env.get("HPCTRAIN_ATTEMPT", "0") or 0),
        "step": step,
        "at": marks(),
    }


def reset() -> None:
    """Forget the marks (a test that starts several trainers in one process)."""
    _at.clear()

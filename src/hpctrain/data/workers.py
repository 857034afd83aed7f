"""`data.workers: auto`: loader workers from the CPUs this task has, so that a rank neither starves
its GPU on a node with many cores per GPU nor oversubscribes the cores it shares with its node's
other ranks (a fixed 4 workers × 8 ranks on a node that gave each task one CPU: 40 processes on 8
cores). Runs in the task, which has no Slurm commands: it reads what srun put in its environment
and its own CPU affinity (docs/sites.md, "CPU and GPU binding").
"""

from __future__ import annotations

import os
from collections.abc import Mapping

AUTO_MAX = 8  # each worker is a process holding prefetch_factor (4) batches: more rarely pays, and costs memory


def task_cpus(environ: Mapping[str, str], affinity: int) -> tuple[int, str]:
    """(CPUs this task may use, where that figure came from). `affinity`: len(os.sched_getaffinity(0)).

    SLURM_CPUS_PER_TASK (srun sets it with --cpus-per-task) is the task's share, but never more than
    its affinity; else a binding that srun applied (SLURM_CPU_BIND_TYPE other than none, set by
    task/affinity) makes the affinity the task's own; else the affinity is shared by the node's ranks
    (LOCAL_WORLD_SIZE: launch.task, torchrun; SLURM_NTASKS_PER_NODE: a batch script's srun)."""
    share = environ.get("SLURM_CPUS_PER_TASK", "")
    if share.isdigit() and int(share) > 0:
        return min(int(share), affinity), f"SLURM_CPUS_PER_TASK={share}, {affinity} CPUs in its affinity"
    bind = environ.get("SLURM_CPU_BIND_TYPE", "").strip(",")
    if bind and not bind.startswith("none"):
        return affinity, f"its {affinity} CPUs (srun --cpu-bind={bind})"
    counts = (environ.get("LOCAL_WORLD_SIZE", ""), environ.get("SLURM_NTASKS_PER_NODE", ""))
    local = next((int(v) for v in counts if v.isdigit()), 1)
    return max(1, affinity // max(1, local)), f"{affinity} CPUs in its affinity shared by {local} rank(s)"


def auto_workers(cpus: int) -> int:
    """One CPU for the rank itself (the training loop, the host side of its GPU), the rest for
    workers, at most AUTO_MAX."""
    return max(0, min(AUTO_MAX, cpus - 1))


def resolve_workers(value: int | str, environ: Mapping[str, str] | None = None) -> tuple[int, str]:
    """(workers, why) for `data.workers`: an integer as given; auto from task_cpus."""
    if value != "auto":
        return int(value), f"data.workers={value}"
    cpus, where = task_cpus(os.environ if environ is None else environ, len(os.sched_getaffinity(0)))
    n = auto_workers(cpus)
    return n, f"data.workers=auto: {n} per rank ({cpus} CPUs for the task: {where}; one is the rank's own)"

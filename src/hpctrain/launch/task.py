"""The function submitit runs in every task: ranks from submitit's job environment, then train."""

from __future__ import annotations

import os
from typing import Any


def export_job_env() -> None:
    """Set RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* from submitit (local or Slurm) unless already set."""
    import submitit

    from hpctrain.train.dist import port_from_job_id

    env = submitit.JobEnvironment()
    os.environ.update({
        "RANK": str(env.global_rank), "WORLD_SIZE": str(env.num_tasks), "LOCAL_RANK": str(env.local_rank),
        "LOCAL_WORLD_SIZE": str(env.num_tasks // max(1, env.num_nodes)),
    })
    os.environ.setdefault("MASTER_ADDR", env.hostnames[0] if env.hostnames else "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port_from_job_id(env.job_id)))


def train_task(cfg: dict[str, Any]) -> dict[str, Any]:
    """Train; after a USR2 stop that requeued the job, exit without a result (the job runs again).

    submitit installed its own USR2 handler (checkpoint-and-requeue of the pickled call) before
    calling us; ours replaces it first thing, so the trainer alone decides, at a step boundary.
    SystemExit is not an Exception, so submitit writes no result file for a requeued task.
    """
    from hpctrain.train.entry import StopFlag

    stop = StopFlag()
    stop.install()
    from hpctrain.launch.requeue import after_stop, check_budget

    check_budget()
    export_job_env()
    from hpctrain.train.entry import run

    summary = run(cfg, stop)
    if after_stop(summary, summary["rank"]):
        raise SystemExit(0)
    return summary

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
    export_job_env()
    from hpctrain.train.entry import run

    return run(cfg)

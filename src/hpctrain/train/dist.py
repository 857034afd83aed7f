"""Who am I in the job: ranks from torchrun, Slurm's srun, or a lone process.

Under srun every task is one rank (no torchrun inside Slurm); MASTER_ADDR is the job's first
host and MASTER_PORT is derived from the job id, so all tasks agree without talking.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from hpctrain.run.rundir import attempt_of

log = logging.getLogger("hpctrain")


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    source: str = "single"  # torchrun | srun | sbatch-script | submitit-slurm | submitit-local | env | single

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm hostlist → host names: 'gpu[01-03,7],login' → gpu01 gpu02 gpu03 gpu7 login."""
    hosts: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", hostlist):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            hosts.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not hi:
                hosts.append(f"{prefix}{lo}{suffix}")
                continue
            width = len(lo)
            hosts += [f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1)]
    return hosts


PORT_BASE, PORT_SPAN = 15000, 15000
# 16 attempts × 937 ids = 14992 ports: all different within the span
ATTEMPT_STRIDE = 937


def port_from_job_id(job_id: str | int, attempt: int = 0) -> int:
    """The rendezvous port every task of a job computes alike, without talking: 15000-29999.

    `attempt` (HPCTRAIN_ATTEMPT: a step started again in the same job, on the same or other nodes;
    plus SLURM_RESTART_COUNT, a requeue) moves it on, so a new rank 0 never waits for a port the
    failed step's rank 0 still holds.

    From SLURM_JOB_ID, which is unique per array element (SLURM_ARRAY_JOB_ID is shared by all
    of them). An attempt moves the port ATTEMPT_STRIDE down, not one up: with one up, attempt k of
    job j took job j+k's port, and array elements have consecutive ids on shared nodes. Now jobs
    whose ids differ by less than ATTEMPT_STRIDE never share a port in their first 16 attempts
    (tests/train/test_dist.py). The range stays below Linux's ephemeral ports (32768-60999), which
    outgoing connections may hold.
    """
    digits = re.sub(r"\D", "", str(job_id)) or "0"
    return PORT_BASE + (int(digits) - ATTEMPT_STRIDE * attempt) % PORT_SPAN


def restart_of(env: Mapping[str, str]) -> int:
    """Slurm's restart count of this job (SLURM_RESTART_COUNT: its requeues; 0 when unset)."""
    r = env.get("SLURM_RESTART_COUNT", "")
    return int(r) if r.isdigit() else 0


def detect(env: Mapping[str, str] | None = None) -> DistInfo:
    """Read rank/world/local rank and the rendezvous address from the environment.

    Inside a Slurm step everything comes from Slurm (SLURM_PROCID, the step's first host, the job
    id; and the batch shell's attempt, when a step runs again on spare nodes): sbatch exports the
    submitting shell's environment into the job, so RANK or MASTER_ADDR left there from an earlier
    torchrun must not decide anything. torchrun (TORCHELASTIC_RUN_ID) is trusted wherever it runs,
    also under srun. `source` names the launcher for env.json.
    """
    env = os.environ if env is None else env
    if "TORCHELASTIC_RUN_ID" in env and "RANK" in env:
        return DistInfo(
            int(env["RANK"]),
            int(env["WORLD_SIZE"]),
            int(env.get("LOCAL_RANK", 0)),
            env.get("MASTER_ADDR", "127.0.0.1"),
            int(env.get("MASTER_PORT", 29500)),
            "torchrun",
        )
    # SLURM_STEP_ID: inside an srun step. The batch script itself is not a rank.
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and "SLURM_STEP_ID" in env:
        hosts = expand_hostlist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", ""))
        source = env.get("HPCTRAIN_LAUNCHER") or "srun"
        return DistInfo(
            int(env["SLURM_PROCID"]),
            int(env["SLURM_NTASKS"]),
            int(env.get("SLURM_LOCALID", 0)),
            hosts[0] if hosts else "127.0.0.1",
            # a requeued job moves on too: its previous allocation's rank 0 may still hold the port on a
            # node that hangs (measured on the test cluster, whose nodes share one network stack)
            port_from_job_id(env.get("SLURM_JOB_ID", "0"), attempt_of(env) + restart_of(env)),
            source,
        )
    if "RANK" in env and "WORLD_SIZE" in env:  # set by hand, or by submitit's local executor
        return DistInfo(
            int(env["RANK"]),
            int(env["WORLD_SIZE"]),
            int(env.get("LOCAL_RANK", 0)),
            env.get("MASTER_ADDR", "127.0.0.1"),
            int(env.get("MASTER_PORT", 29500)),
            env.get("HPCTRAIN_LAUNCHER") or "env",
        )
    return DistInfo()

"""Who am I in the job: ranks from torchrun, Slurm's srun, or a lone process.

Under srun every task is one rank (no torchrun inside Slurm); MASTER_ADDR is the job's first
host and MASTER_PORT is derived from the job id, so all tasks agree without talking.
"""

from __future__ import annotations

import datetime
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    source: str = "single"  # torchrun | slurm | single

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


def port_from_job_id(job_id: str | int) -> int:
    """A port every task of the job computes alike: 15000-34999 from the job id's digits."""
    digits = re.sub(r"\D", "", str(job_id)) or "0"
    return 15000 + int(digits[-4:]) % 20000


def detect(env: Mapping[str, str] | None = None) -> DistInfo:
    """Read rank/world/local rank and the rendezvous address from the environment."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return DistInfo(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0)),
                        env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", 29500)),
                        "torchrun")
    # SLURM_STEP_ID: inside an srun step. The batch script itself is not a rank.
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and "SLURM_STEP_ID" in env:
        hosts = expand_hostlist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", ""))
        addr = env.get("MASTER_ADDR") or (hosts[0] if hosts else "127.0.0.1")
        job = env.get("SLURM_ARRAY_JOB_ID") or env.get("SLURM_JOB_ID", "0")
        port = int(env.get("MASTER_PORT") or port_from_job_id(job))
        return DistInfo(int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]),
                        int(env.get("SLURM_LOCALID", 0)), addr, port, "slurm")
    return DistInfo()


def init(info: DistInfo, backend: str, timeout_s: int) -> None:
    """Join the process group (no-op for one process)."""
    import torch.distributed as td

    if info.world_size == 1 or td.is_initialized():
        return
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    td.init_process_group(backend=backend, init_method=f"tcp://{info.master_addr}:{info.master_port}",
                          rank=info.rank, world_size=info.world_size,
                          timeout=datetime.timedelta(seconds=timeout_s))


def shutdown() -> None:
    import torch.distributed as td

    if td.is_initialized():
        td.destroy_process_group()


def all_reduce_sum(values: list[float], device) -> list[float]:
    """Sum a few numbers over all ranks (identity for one process)."""
    import torch
    import torch.distributed as td

    if not td.is_initialized():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    td.all_reduce(t)
    return t.tolist()


def any_rank(flag: bool, device) -> bool:
    """True on every rank when any rank says so: stop/save/requeue decisions are unanimous."""
    return all_reduce_sum([1.0 if flag else 0.0], device)[0] > 0

"""Resource limits that break distributed training quietly (locked memory for RDMA)."""

from __future__ import annotations

import resource

from hpctrain.doctor.checks import Check


def memlock_check(soft: int, hard: int, rdma: bool) -> Check:
    """The locked-memory limit (`ulimit -l`). RDMA (NCCL over InfiniBand/RoCE verbs) registers, so
    locks, its buffers; Slurm gives a job the submitting shell's soft limits (slurm.conf(5),
    PropagateResourceLimits: all by default), often 64 KiB on a login node. The batch script
    raises it as far as the hard limit allows (launch/sbatch.py)."""

    def kib(n: int) -> str:
        return "unlimited" if n == resource.RLIM_INFINITY else f"{n // 1024} KiB"

    if soft == resource.RLIM_INFINITY:
        return Check("limits", "locked memory", "ok", "unlimited")
    value = f"{kib(soft)} (hard limit {kib(hard)})"
    if not rdma:
        return Check("limits", "locked memory", "info", value, "matters only for RDMA (InfiniBand/RoCE) ports")
    return Check(
        "limits",
        "locked memory",
        "warn" if hard != resource.RLIM_INFINITY else "info",
        value,
        "NCCL over InfiniBand/RoCE locks its buffers: a job inherits this shell's limit (Slurm "
        "PropagateResourceLimits) and hpctrain's batch script raises it only up to the hard limit; ask the "
        "admins for `memlock unlimited` (limits.conf, and slurmd's own) or "
        "PropagateResourceLimitsExcept=MEMLOCK (Slurm FAQ, #memlock)",
    )

"""Fabric → NCCL environment. Values are the usual ones for each fabric; the profile's `env`
mapping wins over every derived value (per site), and a variable already set in the job's
environment wins over both (per job: `NCCL_DEBUG=INFO sbatch …`)."""

from __future__ import annotations

import shlex

from hpctrain.launch.profile import ClusterProfile


def fabric_env(profile: ClusterProfile) -> dict[str, str]:
    """NCCL_* / TORCH_NCCL_* variables for the profile's fabric, then the profile's own env."""
    f = profile.fabric
    env: dict[str, str] = {}
    if f.kind in ("ib", "roce"):
        if f.hcas:
            env["NCCL_IB_HCA"] = ",".join(f.hcas)
        env["NCCL_IB_DISABLE"] = "0"
        env["NCCL_IB_TIMEOUT"] = str(f.ib_timeout)
        env["NCCL_IB_RETRY_CNT"] = str(f.retry_cnt)
        if f.kind == "roce":
            env["NCCL_IB_GID_INDEX"] = str(f.gid_index)
    else:
        env["NCCL_IB_DISABLE"] = "1"
    if f.ifname:
        env["NCCL_SOCKET_IFNAME"] = f.ifname
        env["GLOO_SOCKET_IFNAME"] = f.ifname
    if f.nccl_debug:
        env["NCCL_DEBUG"] = f.nccl_debug
    env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = str(f.async_error_handling)
    env.update(profile.env)
    return env


def export_lines(env: dict[str, str], env_wins: bool = False) -> list[str]:
    """`export K=v` lines; with env_wins a value already in the job's environment is kept."""
    if env_wins:
        return [f"export {k}=${{{k}-{shlex.quote(v)}}}" for k, v in env.items()]
    return [f"export {k}={shlex.quote(v)}" for k, v in env.items()]

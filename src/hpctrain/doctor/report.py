"""One doctor run: every check in order, the suggested environment, and the text the CLI prints."""

from __future__ import annotations

import os
import platform
import resource
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpctrain.allreduce import format_rows
from hpctrain.doctor.checks import Check
from hpctrain.doctor.container import container_checks, in_container, runtime_checks
from hpctrain.doctor.env import interfaces, nccl_env_checks
from hpctrain.doctor.fabric import IBPort, gpudirect_check, ib_ports, suggest_nccl
from hpctrain.doctor.gpus import gpu_numa_nodes
from hpctrain.doctor.limits import memlock_check
from hpctrain.doctor.site_fit import profile_checks
from hpctrain.doctor.versions import gpus, version_checks, versions
from hpctrain.site import gpudirect
from hpctrain.site.profile import ClusterProfile


@dataclass
class Report:
    versions: dict[str, str | None]
    gpus: list[str]
    ports: list[IBPort]
    suggested_env: dict[str, str]
    in_container: bool
    checks: list[Check] = field(default_factory=list)
    allreduce: list[dict] | None = None
    gpu_numa: list[int] = field(default_factory=list)  # NUMA node of each NVIDIA GPU (PCI)
    profile: str = ""  # the cluster profile this node was checked against ("" for none)

    @property
    def ok(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def run(
    sysfs_root: str | Path = "/sys",
    env: Mapping[str, str] | None = None,
    root: str = "/",
    profile: ClusterProfile | None = None,
) -> Report:
    """Every check of this node; with `profile`, also how the node fits what its jobs expect (and the
    runtime asked for is the profile's, not whichever this node has)."""
    env = os.environ if env is None else env
    v = versions()
    gpu_names = gpus()
    ports = ib_ports(sysfs_root)
    gpu_numa = gpu_numa_nodes(sysfs_root)
    suggested, ib_checks = suggest_nccl(ports, gpu_numa, v["nccl"])
    inside = in_container(env)
    checks = version_checks(v, gpu_names) + ib_checks
    gdr = gpudirect_check(ports, len(gpu_numa), gpudirect.detect(sysfs_root, Path(root, "proc")), dict(env))
    checks += [gdr] if gdr else []
    checks += nccl_env_checks(env, ports, interfaces(sysfs_root), gpu_numa)
    checks += container_checks(env, ports, inside, root)
    if not inside and profile is None:  # inside an image no runtime starts another
        checks += runtime_checks()
    if profile is not None:
        checks += profile_checks(profile, gpu_names, ports, inside)
    checks.append(memlock_check(*resource.getrlimit(resource.RLIMIT_MEMLOCK), rdma=bool(ports)))
    name = profile.name if profile else ""
    return Report(v, gpu_names, ports, suggested, inside, checks, gpu_numa=gpu_numa, profile=name)


def profile_lines(suggested: Mapping[str, str]) -> list[str]:
    """The suggested NCCL_* values as the profile keys that export them (site/fabric.py)."""
    out = []
    if "NCCL_IB_HCA" in suggested:
        out.append(f"    hcas: [{', '.join(suggested['NCCL_IB_HCA'].lstrip('=').split(','))}]")
    if "NCCL_IB_GID_INDEX" in suggested:
        out.append(f"    gid_index: {suggested['NCCL_IB_GID_INDEX']}")
    return out


def format_report(r: Report) -> str:
    width = max(len(c.name) for c in r.checks)
    where = "inside a container" if r.in_container else "on the host"
    against = f", against cluster profile {r.profile}" if r.profile else ""
    lines = [f"hpctrain doctor — {platform.node()} ({where}){against}", ""]
    section = None
    for c in r.checks:
        if c.section != section:
            section = c.section
            lines.append(f"[{section}]")
        lines.append(f"  {c.status.upper():<5} {c.name:<{width}}  {c.value}")
        if c.hint:
            lines.append(f"        {'':<{width}}  → {c.hint}")
    if r.suggested_env:
        lines += ["", "suggested environment:"] + [f"  export {k}={v}" for k, v in r.suggested_env.items()]
        lines += ["", "or in the cluster profile (only where NCCL's own choice is wrong):", "  fabric:"]
        lines += profile_lines(r.suggested_env)
    if r.allreduce:
        lines += ["", format_rows(r.allreduce)]
    n_fail = sum(c.status == "fail" for c in r.checks)
    n_warn = sum(c.status == "warn" for c in r.checks)
    lines += ["", f"{n_fail} problem(s), {n_warn} warning(s)"]
    return "\n".join(lines)

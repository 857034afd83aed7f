"""The NCCL_* and GLOO_* variables a job will see, checked against this node's ports and interfaces."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hpctrain.doctor.checks import Check
from hpctrain.doctor.fabric import IBPort, numa_split
from hpctrain.site.fabric import exact_hcas, gloo_ifname, hca_matches, ifname_matches, net_interfaces, split_spec


def interfaces(sysfs_root: str | Path = "/sys") -> list[str]:
    """The node's interfaces that are not down: what NCCL and gloo can bind to."""
    return net_interfaces(sysfs_root, up_only=True)


def nccl_env_checks(
    env: Mapping[str, str], ports: list[IBPort], ifaces: list[str], gpu_numa: list[int] | None = None
) -> list[Check]:
    checks = []
    debug = env.get("NCCL_DEBUG", "")
    if debug.upper() in ("INFO", "TRACE"):
        checks.append(
            Check(
                "nccl",
                "NCCL_DEBUG",
                "warn",
                debug,
                "left on, it writes thousands of lines per rank at scale: unset it or use WARN",
            )
        )
    spec = env.get("NCCL_SOCKET_IFNAME")
    if spec and not spec.startswith("^"):  # `^a,b` excludes; `=a,b` exact names; else name prefixes
        if ifname_matches(spec, ifaces):
            checks.append(Check("nccl", "NCCL_SOCKET_IFNAME", "ok", spec))
        else:
            checks.append(
                Check(
                    "nccl",
                    "NCCL_SOCKET_IFNAME",
                    "fail",
                    spec,
                    f"no interface matches it (this node has: {', '.join(ifaces) or 'none'}); "
                    "NCCL will fail to bootstrap: fix or unset it (IPoIB may be ibp…, not ib0)",
                )
            )
    checks += gloo_checks(env, ifaces)
    hca = env.get("NCCL_IB_HCA")
    if hca:
        checks.append(hca_check(hca, ports, gpu_numa or []))
    if env.get("NCCL_IB_DISABLE") == "1" and any(p.state == "ACTIVE" for p in ports):
        checks.append(
            Check(
                "nccl",
                "NCCL_IB_DISABLE",
                "warn",
                "1",
                "InfiniBand/RoCE is ACTIVE here but disabled for NCCL: traffic goes over TCP",
            )
        )
    for var in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"):
        if env.get(var) == "1":
            checks.append(Check("nccl", var, "warn", "1", "slows GPU-to-GPU traffic inside a node; unset it"))
    if not checks:
        checks.append(Check("nccl", "environment", "ok", "no NCCL_* problems found"))
    return checks


def gloo_checks(env: Mapping[str, str], ifaces: list[str]) -> list[Check]:
    """GLOO_SOCKET_IFNAME takes plain interface names (no NCCL `^`/`=`/prefix syntax); unset, a
    task derives it from NCCL_SOCKET_IFNAME (site.fabric.set_gloo_ifname): say what it would get."""
    given = env.get("GLOO_SOCKET_IFNAME")
    if given:
        bad = [n for n in given.split(",") if n not in ifaces]
        if bad:
            return [
                Check(
                    "nccl",
                    "GLOO_SOCKET_IFNAME",
                    "fail",
                    given,
                    f"{', '.join(bad)} is not an interface here (this node has: {', '.join(ifaces) or 'none'}): "
                    "gloo takes plain names, no ^, = or prefixes; unset it and hpctrain derives one "
                    "from NCCL_SOCKET_IFNAME on each node",
                )
            ]
        return [Check("nccl", "GLOO_SOCKET_IFNAME", "ok", given)]
    spec = env.get("NCCL_SOCKET_IFNAME")
    if not spec:
        return []
    name = gloo_ifname(spec, ifaces)
    if name:
        return [Check("nccl", "GLOO_SOCKET_IFNAME", "ok", f"{name} (derived from NCCL_SOCKET_IFNAME at task start)")]
    return [
        Check(
            "nccl",
            "GLOO_SOCKET_IFNAME",
            "info",
            "left unset",
            f"no interface here matches NCCL_SOCKET_IFNAME={spec}: gloo uses the host name's address",
        )
    ]


def hca_check(spec: str, ports: list[IBPort], gpu_numa: list[int]) -> Check:
    """NCCL_IB_HCA against this node: names that select nothing (fail), bare names that NCCL
    reads as prefixes and that select more than meant (mlx5_1 → mlx5_10 …), and ports that share
    no NUMA node with a GPU (storage/in-band rails)."""
    exclude, exact, tokens = split_spec(spec)
    devices = {p.device for p in ports}
    if exclude:
        return Check("nccl", "NCCL_IB_HCA", "ok", spec, "an exclude list: NCCL picks among the rest")
    have = {p.name for p in ports}
    found = hca_matches(spec, devices)
    missing = [t for t in tokens if not found[t] or (":" in t and exact and t not in have)]
    if missing:
        return Check(
            "nccl",
            "NCCL_IB_HCA",
            "fail",
            spec,
            f"{', '.join(missing)} not on this node (have: {', '.join(sorted(have)) or 'none'})",
        )
    problems = []
    names = [t.split(":")[0] for t in tokens]
    if not exact:  # a bare device name that is also the prefix of others (mlx5_1 → mlx5_10 …)
        wide = {t: [d for d in found[t] if d != n] for t, n in zip(tokens, names) if n in devices}
        also = "; ".join(f"{t} also selects {', '.join(extra)}" for t, extra in wide.items() if extra)
        if also:
            fix = exact_hcas(tokens) if all(n in devices for n in names) else "'=' and each device"
            problems.append(f"entries without '=' are prefixes: {also}; write {fix}")
    chosen = [p for p in ports if any(p.device in found[t] for t in tokens)]
    split = numa_split(chosen, gpu_numa)
    if split and split[1]:
        far = ", ".join(f"{p.name} (NUMA {p.numa_node})" for p in split[1])
        problems.append(f"{far}: no GPU on that NUMA node (storage or in-band rail?): leave it out")
    if problems:
        return Check("nccl", "NCCL_IB_HCA", "warn", spec, "; ".join(problems))
    return Check("nccl", "NCCL_IB_HCA", "ok", spec)

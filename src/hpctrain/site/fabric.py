"""Fabric → NCCL environment. Values are the usual ones for each fabric; the profile's `env`
mapping wins over every derived value (per site). In the stand-alone `slurm/vit.sbatch` a variable
already set in the job's environment wins over both (per job: `NCCL_DEBUG=INFO sbatch …`); a script
`hpctrain submit` writes fixes them at submission (per job: `--cluster-set fabric.nccl_debug=INFO`).

What is left unset is deliberate: a wrong value fails every job, an unset one lets NCCL choose
(NCCL's environment-variable documentation,
https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html):

- `NCCL_IB_HCA`: unset, NCCL takes the HCAs nearest each GPU (PCI topology). When a profile names
  them, they are written exact (`=mlx5_0:1,…`): an entry without `=` is a *prefix*, so `mlx5_1`
  also selects `mlx5_10`…`mlx5_19`, which on a DGX H100 are compute rails of other GPUs.
- `NCCL_SOCKET_IFNAME`: unset, NCCL skips `lo`/`docker*` and prefers `ib*`. IPoIB is not always
  `ib0` (DGX H100: `ibp24s0` …). `GLOO_SOCKET_IFNAME` takes plain names only, a comma list
  being a round-robin that every rank must give alike (https://pytorch.org/docs/stable/
  distributed.html#choosing-the-network-interface-to-use), so it is never given the NCCL
  pattern: each task derives one name from it at start-up (`gloo_ifname` below).
- `NCCL_IB_GID_INDEX`: since NCCL 2.21 the default (-1) picks the RoCE v2 GID of the configured
  address family itself (`ncclIbGetGidIndex`, https://github.com/NVIDIA/nccl/blob/master/src/
  transport/net_ib/connect.cc); a forced 3 is an IPv6 or VLAN GID on many tables. Exported only
  when the profile names one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, MutableMapping, Sequence
from pathlib import Path

from hpctrain import shellfile
from hpctrain.site.profile import ClusterProfile

log = logging.getLogger("hpctrain")


def exact_hcas(hcas: Sequence[str]) -> str:
    """`=dev:port,…` for NCCL_IB_HCA (port 1 unless given): exact names, never prefixes."""
    return "=" + ",".join(h if ":" in h else f"{h}:1" for h in hcas)


def fabric_env(profile: ClusterProfile) -> dict[str, str]:
    """NCCL_* / TORCH_NCCL_* variables for the profile's fabric, then the profile's own env."""
    f = profile.fabric
    env: dict[str, str] = {}
    if f.kind in ("ib", "roce"):
        if f.hcas:
            env["NCCL_IB_HCA"] = exact_hcas(f.hcas)
        env["NCCL_IB_DISABLE"] = "0"
        env["NCCL_IB_TIMEOUT"] = str(f.ib_timeout)
        env["NCCL_IB_RETRY_CNT"] = str(f.retry_cnt)
        if f.gid_index >= 0:
            env["NCCL_IB_GID_INDEX"] = str(f.gid_index)
    else:
        env["NCCL_IB_DISABLE"] = "1"
    if f.ifname:  # for NCCL only: gloo gets a plain name at task start (train.dist)
        env["NCCL_SOCKET_IFNAME"] = f.ifname
    if f.nccl_debug:
        env["NCCL_DEBUG"] = f.nccl_debug
    env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = str(f.async_error_handling)
    env.update(profile.env)
    return env


def left_to_nccl(profile: ClusterProfile) -> list[str]:
    """Comment lines for the batch script naming what is deliberately unset, so that a reader
    does not "fix" it with a guess (and knows where a site names it and how to check it)."""
    env = fabric_env(profile)
    keys = {"NCCL_IB_HCA": "hcas", "NCCL_SOCKET_IFNAME": "ifname", "NCCL_IB_GID_INDEX": "gid_index"}
    if profile.fabric.kind == "socket":
        keys = {"NCCL_SOCKET_IFNAME": "ifname"}
    left = [k for k in keys if k not in env]
    if not left:
        return []
    where = ", ".join(f"fabric.{keys[k]}" for k in left)
    return [
        f"# Unset, so NCCL chooses: {', '.join(left)}.",
        f"# A site that must name them sets {where} in its profile;",
        "# `hpctrain doctor --cluster <profile>` on a compute node checks them.",
    ]


def export_lines(env: dict[str, str], env_wins: bool = False) -> list[str]:
    """`export K=v` lines; with env_wins (slurm/vit.sbatch only) a value already in the job's environment is kept."""
    if env_wins:
        return [f"export {shellfile.default(k, v)}" for k, v in env.items()]
    return [f"export {shellfile.assign(k, v)}" for k, v in env.items()]


# ---------------------------------------------------------------- NCCL's list syntax


def split_spec(spec: str) -> tuple[bool, bool, list[str]]:
    """NCCL's `[^][=]a,b,…` (NCCL_SOCKET_IFNAME, NCCL_IB_HCA) → (exclude, exact, tokens)."""
    exclude = spec.startswith("^")
    rest = spec[1:] if exclude else spec
    exact = rest.startswith("=")
    rest = rest[1:] if exact else rest
    return exclude, exact, [t for t in rest.split(",") if t]


def ifname_matches(spec: str, interfaces: Iterable[str]) -> list[str]:
    """The interfaces an NCCL_SOCKET_IFNAME value selects, in the order given (NCCL's rules:
    prefixes unless `=`, an exclude list after `^`)."""
    exclude, exact, tokens = split_spec(spec)

    def hit(name: str) -> bool:
        return name in tokens if exact else any(name.startswith(t) for t in tokens)

    return [i for i in interfaces if hit(i) != exclude]


def hca_matches(spec: str, devices: Iterable[str]) -> dict[str, list[str]]:
    """For each entry of an NCCL_IB_HCA value, the devices it selects (prefixes unless `=`;
    exclude lists map every token to the devices it removes)."""
    _, exact, tokens = split_spec(spec)
    devs = sorted(set(devices))
    out = {}
    for t in tokens:
        name = t.split(":")[0]
        out[t] = [d for d in devs if (d == name if exact else d.startswith(name))]
    return out


def net_interfaces(sysfs_root: str | Path = "/sys", up_only: bool = False) -> list[str]:
    """Interface names under <sysfs>/class/net; with up_only, those whose operstate is not
    `down` (`unknown` stays: loopback and some IPoIB drivers report it while they work)."""
    names = []
    for p in sorted(Path(sysfs_root, "class/net").glob("*")):
        if up_only:
            try:
                state = (p / "operstate").read_text().strip()
            except OSError:
                state = "unknown"
            if state == "down":
                continue
        names.append(p.name)
    return names


def gloo_ifname(pattern: str, interfaces: Iterable[str]) -> str | None:
    """One plain interface name for GLOO_SOCKET_IFNAME that the NCCL_SOCKET_IFNAME `pattern`
    selects among `interfaces`, or None (leave gloo to its default).

    gloo takes plain names only: no `^`, `=` or prefixes, and a comma list means "round-robin
    over these", which every rank must give with the same length (PyTorch's distributed docs,
    "Choosing the network interface to use"). So each node picks exactly one: for an include
    list, the first token's first match (the site's order); for an exclude list, like NCCL's own
    choice, `ib*` first and never `lo`/`docker*` (reachable from no other node).
    """
    names = sorted(set(interfaces))
    exclude, exact, tokens = split_spec(pattern)
    hits = ifname_matches(pattern, names)
    if exclude:
        hits = [n for n in hits if n != "lo" and not n.startswith("docker")]
        hits.sort(key=lambda n: (not n.startswith("ib"), n))
        return hits[0] if hits else None
    for t in tokens:  # include list: the order the site wrote
        for n in hits:
            if (n == t) if exact else n.startswith(t):
                return n
    return None


def set_gloo_ifname(env: MutableMapping[str, str] | None = None, sysfs_root: str | Path = "/sys") -> str | None:
    """Set GLOO_SOCKET_IFNAME from NCCL_SOCKET_IFNAME and this node's interfaces that are up,
    unless it is set already (a site's or a user's choice wins). Returns the name set.

    Runs in every task, on its own node: interface names differ between nodes (ibp24s0 here,
    ibp26s0 there), which one exported value cannot express.
    """
    env = os.environ if env is None else env
    pattern = env.get("NCCL_SOCKET_IFNAME", "")
    if not pattern or env.get("GLOO_SOCKET_IFNAME"):
        return None
    up = net_interfaces(sysfs_root, up_only=True)
    name = gloo_ifname(pattern, up)
    if name is None:
        log.warning(
            "GLOO_SOCKET_IFNAME left unset: no interface that is up here (%s) matches "
            "NCCL_SOCKET_IFNAME=%s; gloo uses the address of the host name",
            ", ".join(up) or "none",
            pattern,
        )
        return None
    env["GLOO_SOCKET_IFNAME"] = name
    log.info("GLOO_SOCKET_IFNAME=%s (from NCCL_SOCKET_IFNAME=%s)", name, pattern)
    return name

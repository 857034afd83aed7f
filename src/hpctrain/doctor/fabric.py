"""The InfiniBand/RoCE ports of this node and the NCCL settings they call for: which HCAs are
near the GPUs, the fastest active ones (NCCL_IB_HCA), and RoCE's GID index."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hpctrain.doctor.checks import Check
from hpctrain.doctor.sysfs import natural_key, pci_numa_node, read_or_empty
from hpctrain.site.gpudirect import GpuDirect


@dataclass(frozen=True)
class IBPort:
    device: str
    port: int
    state: str  # ACTIVE, DOWN, INIT, …
    rate: str  # as sysfs writes it: "200 Gb/sec (4X HDR)"
    gbps: float
    link_layer: str  # InfiniBand | Ethernet (RoCE)
    roce_v2_gid: int | None = None  # this port's lowest RoCE v2 GID index with an IPv4-mapped address
    numa_node: int = -1  # the HCA's NUMA node (<dev>/device/numa_node); -1: not reported

    @property
    def name(self) -> str:
        return f"{self.device}:{self.port}"


def ib_ports(sysfs_root: str | Path = "/sys") -> list[IBPort]:
    """Ports under <sysfs>/class/infiniband/<dev>/ports/<n>/ (state, rate, link_layer, gids)."""
    ports = []
    for dev in sorted(Path(sysfs_root, "class/infiniband").glob("*"), key=lambda d: natural_key(d.name)):
        for pdir in sorted(dev.glob("ports/*"), key=lambda p: int(p.name) if p.name.isdigit() else 0):
            if not pdir.name.isdigit():
                continue
            state = read_or_empty(pdir / "state").split(":")[-1].strip() or "UNKNOWN"
            rate = read_or_empty(pdir / "rate")
            m = re.match(r"([\d.]+)\s*Gb/sec", rate)
            link = read_or_empty(pdir / "link_layer") or "InfiniBand"
            gid = None
            if link == "Ethernet":
                for g in sorted(pdir.glob("gids/*"), key=lambda p: int(p.name) if p.name.isdigit() else 0):
                    kind = read_or_empty(pdir / "gid_attrs" / "types" / g.name)
                    value = read_or_empty(g)
                    if kind.lower().startswith("roce v2") and value.startswith("0000:0000:0000:0000:0000:ffff:"):
                        gid = int(g.name)
                        break
            ports.append(
                IBPort(
                    dev.name,
                    int(pdir.name),
                    state,
                    rate,
                    float(m.group(1)) if m else 0.0,
                    link,
                    gid,
                    pci_numa_node(dev / "device"),
                )
            )
    return ports


def numa_split(ports: list[IBPort], gpu_numa: list[int]) -> tuple[list[IBPort], list[IBPort]] | None:
    """(ports on a NUMA node with a GPU, ports on one without), or None when the topology does not
    say: no GPU found, or a NUMA node not reported. NCCL itself ranks HCAs by PCI distance to each
    GPU when NCCL_IB_HCA is unset; a port on a NUMA node with no GPU (DGX H100's storage and
    in-band rails when they sit there) is never the near one for any GPU."""
    if not gpu_numa or min(gpu_numa) < 0 or any(p.numa_node < 0 for p in ports):
        return None
    near = [p for p in ports if p.numa_node in set(gpu_numa)]
    return near, [p for p in ports if p not in near]


def nccl_version_at_least(version: str | None, want: tuple[int, int]) -> bool | None:
    """'2.21.5' >= (2, 21)? None when the version is unknown (no torch, a CPU build)."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return None if not m else (int(m.group(1)), int(m.group(2))) >= want


def suggest_nccl(
    ports: list[IBPort], gpu_numa: list[int] | None = None, nccl_version: str | None = None
) -> tuple[dict[str, str], list[Check]]:
    """NCCL_IB_HCA (exact `=dev:port` list of the fastest active GPU-near ports) and, per port,
    the RoCE GID advice."""
    checks: list[Check] = []
    if not ports:
        return {}, [
            Check(
                "infiniband",
                "ports",
                "info",
                "none (no /sys/class/infiniband)",
                "NCCL will use TCP sockets; fine on a login node or a single-node job",
            )
        ]
    for p in ports:
        status = "ok" if p.state == "ACTIVE" else "warn"
        where = f", NUMA {p.numa_node}" if p.numa_node >= 0 else ""
        gid = ""
        if p.link_layer == "Ethernet":
            gid = f", RoCE v2 GID {p.roce_v2_gid}" if p.roce_v2_gid is not None else ", no RoCE v2 IPv4 GID"
        checks.append(
            Check(
                "infiniband",
                p.name,
                status,
                f"{p.state}, {p.rate or '?'}, {p.link_layer}{where}{gid}",
                "" if status == "ok" else "port not ACTIVE: cable, subnet manager or switch",
            )
        )
    active = [p for p in ports if p.state == "ACTIVE"]
    if not active:
        checks.append(
            Check(
                "infiniband",
                "fabric",
                "warn",
                "no ACTIVE port",
                "NCCL will fall back to TCP sockets between nodes (much slower)",
            )
        )
        return {}, checks
    ib = [p for p in active if p.link_layer == "InfiniBand"]
    chosen = ib or [p for p in active if p.link_layer == "Ethernet"]
    chosen, near_checks = gpu_near_ports(chosen, gpu_numa or [])
    checks += near_checks
    best = max(p.gbps for p in chosen)
    chosen = [p for p in chosen if p.gbps == best]
    env = {"NCCL_IB_HCA": "=" + ",".join(p.name for p in chosen)}
    if ib:
        checks.append(
            Check(
                "infiniband",
                "fabric",
                "ok",
                f"InfiniBand, {len(chosen)}× {best:g} Gb/s",
                "InfiniBand needs no GID index (leave NCCL_IB_GID_INDEX unset)",
            )
        )
        return env, checks
    gid_env, gid_checks = roce_gid_advice(chosen, best, nccl_version)
    return {**env, **gid_env}, checks + gid_checks


def gpu_near_ports(ports: list[IBPort], gpu_numa: list[int]) -> tuple[list[IBPort], list[Check]]:
    """Drop the ports on NUMA nodes without a GPU (storage/in-band rails) when the topology says
    so; keep them all when it does not, or when none is near (then say so)."""
    split = numa_split(ports, gpu_numa)
    if split is None:
        if gpu_numa:  # GPUs here, but a NUMA node not reported
            return ports, [
                Check(
                    "infiniband",
                    "GPU-near ports",
                    "info",
                    "NUMA nodes not reported: all ports kept",
                    "check that each listed port is a compute rail; unset, NCCL_IB_HCA lets NCCL "
                    "take the HCAs nearest each GPU by PCI topology",
                )
            ]
        return ports, []
    near, far = split
    gpu_nodes = ",".join(map(str, sorted(set(gpu_numa))))
    if not far:
        return ports, [Check("infiniband", "GPU-near ports", "ok", f"all on the GPUs' NUMA nodes ({gpu_nodes})")]
    far_names = ", ".join(f"{p.name} (NUMA {p.numa_node})" for p in far)
    if not near:
        return ports, [
            Check(
                "infiniband",
                "GPU-near ports",
                "warn",
                f"no port on the GPUs' NUMA nodes ({gpu_nodes}): all kept",
                f"{far_names}: GPU traffic crosses the CPU interconnect",
            )
        ]
    return near, [
        Check(
            "infiniband",
            "GPU-near ports",
            "ok",
            f"{len(near)} of {len(ports)} on the GPUs' NUMA nodes ({gpu_nodes})",
            f"left out of NCCL_IB_HCA: {far_names}: no GPU on that NUMA node (storage or in-band rail)",
        )
    ]


def roce_gid_advice(ports: list[IBPort], gbps: float, nccl_version: str | None) -> tuple[dict[str, str], list[Check]]:
    """Each port's RoCE v2 IPv4 GID index, never one index for all unless they agree.

    NCCL >= 2.21 picks the RoCE v2 GID of each port itself (NCCL_IB_GID_INDEX=-1, the default);
    older NCCL (2.19 in NGC 23.12) needs the index, and takes one value for every port.
    """
    per_port = ", ".join(f"{p.name} → {'none' if p.roce_v2_gid is None else p.roce_v2_gid}" for p in ports)
    value = f"RoCE v2, {len(ports)}× {gbps:g} Gb/s; RoCE v2 IPv4 GID per port: {per_port}"
    lossless = "the switches need lossless (PFC/ECN) settings"
    missing = [p.name for p in ports if p.roce_v2_gid is None]
    if missing:
        return {}, [
            Check(
                "infiniband",
                "fabric",
                "warn",
                value,
                f"no RoCE v2 GID with an IPv4 address on {', '.join(missing)}: configure the "
                "interface's IP, or NCCL may pick a RoCE v1/link-local GID and hang",
            )
        ]
    gids = sorted({p.roce_v2_gid for p in ports if p.roce_v2_gid is not None})
    auto = nccl_version_at_least(nccl_version, (2, 21))
    if len(gids) > 1:
        return {}, [
            Check(
                "infiniband",
                "fabric",
                "ok" if auto else "warn",
                value,
                "the ports' GID tables differ: no single NCCL_IB_GID_INDEX fits them all; leave it "
                "unset with NCCL >= 2.21 (it picks each port's own)"
                + ("" if auto else ", or with older NCCL list only ports that agree in NCCL_IB_HCA"),
            )
        ]
    gid = gids[0]
    if auto:
        return {}, [
            Check(
                "infiniband",
                "fabric",
                "ok",
                value,
                f"NCCL {nccl_version} picks GID {gid} itself: leave NCCL_IB_GID_INDEX unset; {lossless}",
            )
        ]
    return {"NCCL_IB_GID_INDEX": str(gid)}, [
        Check(
            "infiniband",
            "fabric",
            "ok",
            value,
            f"RoCE needs NCCL_IB_GID_INDEX={gid} with NCCL before 2.21 (NGC 23.12 has 2.19; profile: "
            f"fabric.gid_index: {gid}); NCCL >= 2.21 picks it itself: leave it unset there; {lossless}",
        )
    ]


def gpudirect_check(ports: list[IBPort], gpus: int, g: GpuDirect, env: dict[str, str] | None = None) -> Check | None:
    """GPUDirect RDMA where a node has both HCAs and NVIDIA GPUs (site/gpudirect.py): without it NCCL
    stages every inter-node transfer through host memory and says so only at NCCL_DEBUG=INFO."""
    if not ports or not gpus:
        return None
    active = [p for p in ports if p.state == "ACTIVE"]
    if not active:
        return None
    env = env or {}
    if g.peermem:
        return Check("infiniband", "GPUDirect RDMA", "ok", "nvidia_peermem (a peer-memory module) is loaded")
    if g.dmabuf and env.get("NCCL_DMABUF_ENABLE") != "0":
        return Check("infiniband", "GPUDirect RDMA", "ok", f"DMA-BUF (Linux {g.kernel}, {OPEN_FLAVOUR})")
    why = (
        "NCCL_DMABUF_ENABLE=0 turns DMA-BUF off and no peer-memory module is loaded"
        if g.dmabuf
        else (
            "no peer-memory module loaded and no DMA-BUF "
            + (f"(Linux {g.kernel}, driver: {g.driver or 'none loaded'})")
        )
    )
    return Check(
        "infiniband",
        "GPUDirect RDMA",
        "warn",
        f"{why}: NCCL will stage every inter-node transfer through host memory",
        g.fix() if not g.dmabuf else "unset NCCL_DMABUF_ENABLE (or load nvidia-peermem)",
    )


OPEN_FLAVOUR = "the open GPU kernel module"

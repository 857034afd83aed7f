"""What this node (or this container) has, and what is wrong with it for distributed training.

Runs on a login node without torch or DALI (their imports are guarded), on a compute node, or
inside the image. Every finding is a `Check` with a status (ok/info/warn/fail) and a hint that
says what to do; `fail` makes `hpctrain doctor` exit 1.
"""

from __future__ import annotations

import glob
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpctrain.launch import runtimes
from hpctrain.launch.nccl import exact_hcas, hca_matches, ifname_matches, net_interfaces, split_spec

# Minimum driver for a CUDA major version (CUDA minor-version compatibility).
MIN_DRIVER = {12: (525, 60), 11: (450, 80)}
STATUS_ORDER = {"fail": 0, "warn": 1, "info": 2, "ok": 3}


@dataclass(frozen=True)
class Check:
    section: str
    name: str
    status: str  # ok | info | warn | fail
    value: str
    hint: str = ""


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

    @property
    def ok(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d


# ---------------------------------------------------------------- versions and GPUs


def dist_versions(prefix: str) -> dict[str, str]:
    """Installed distributions whose name starts with `prefix` → version (no import of them)."""
    from importlib import metadata

    out = {}
    for d in metadata.distributions():
        name = (d.metadata["Name"] or "").lower()
        if name.startswith(prefix):
            out[name] = d.version
    return out


def driver_version(proc_root: str = "/proc") -> str | None:
    try:
        text = Path(proc_root, "driver/nvidia/version").read_text()
    except OSError:
        return None
    m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+\.\d+(?:\.\d+)?)", text) or re.search(
        r"\s(\d{3}\.\d+(?:\.\d+)?)\s", text
    )
    return m.group(1) if m else None


def versions() -> dict[str, str | None]:
    """Versions of everything that must fit together; None where absent. Imports torch if present."""
    from hpctrain import __version__

    v: dict[str, str | None] = {
        "python": platform.python_version(),
        "hpctrain": __version__,
        "torch": None,
        "cuda": None,
        "cudnn": None,
        "nccl": None,
        "torch_cuda_available": None,
        "dali": None,
        "dali_package": None,
        "driver": driver_version(),
    }
    try:
        import torch
    except ImportError:
        pass
    except Exception as e:  # a broken install (missing CUDA libraries, …) is itself a finding
        v["torch"] = f"broken: {type(e).__name__}: {e}"
    else:
        v["torch"] = torch.__version__
        v["cuda"] = torch.version.cuda
        cudnn = torch.backends.cudnn.version() if torch.version.cuda else None
        v["cudnn"] = (
            f"{cudnn // 10000}.{cudnn // 100 % 100}.{cudnn % 100}"
            if cudnn and cudnn >= 10000
            else (f"{cudnn // 1000}.{cudnn // 100 % 10}.{cudnn % 100}" if cudnn else None)
        )
        try:
            nccl = torch.cuda.nccl.version()
            v["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        except Exception:  # CPU builds have no NCCL
            v["nccl"] = None
        try:
            v["torch_cuda_available"] = bool(torch.cuda.is_available())
        except Exception:
            v["torch_cuda_available"] = False
    dali = dist_versions("nvidia-dali")
    if dali:
        v["dali_package"] = ", ".join(sorted(dali))
        v["dali"] = ", ".join(dali[k] for k in sorted(dali))
    return v


def gpus() -> list[str]:
    """Names of the GPUs torch can use, else those `nvidia-smi -L` lists (present but maybe unusable)."""
    if "torch" in sys.modules or _importable("torch"):
        try:
            import torch

            if torch.cuda.is_available():
                return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        except Exception:
            pass
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
            return [
                ln.split(":", 1)[1].split("(")[0].strip() for ln in out.splitlines() if ln.startswith("GPU")
            ]
        except (OSError, subprocess.SubprocessError):
            return []
    return []


def _importable(name: str) -> bool:
    from importlib.util import find_spec

    return find_spec(name) is not None


# ---------------------------------------------------------------- InfiniBand / RoCE


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _natural(name: str) -> list:
    """Sort key that puts mlx5_2 before mlx5_10."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", name)]


def ib_ports(sysfs_root: str | Path = "/sys") -> list[IBPort]:
    """Ports under <sysfs>/class/infiniband/<dev>/ports/<n>/ (state, rate, link_layer, gids)."""
    ports = []
    for dev in sorted(Path(sysfs_root, "class/infiniband").glob("*"), key=lambda d: _natural(d.name)):
        for pdir in sorted(dev.glob("ports/*"), key=lambda p: int(p.name) if p.name.isdigit() else 0):
            if not pdir.name.isdigit():
                continue
            state = _read(pdir / "state").split(":")[-1].strip() or "UNKNOWN"
            rate = _read(pdir / "rate")
            m = re.match(r"([\d.]+)\s*Gb/sec", rate)
            link = _read(pdir / "link_layer") or "InfiniBand"
            gid = None
            if link == "Ethernet":
                for g in sorted(pdir.glob("gids/*"), key=lambda p: int(p.name) if p.name.isdigit() else 0):
                    kind = _read(pdir / "gid_attrs" / "types" / g.name)
                    value = _read(g)
                    if kind.lower().startswith("roce v2") and value.startswith(
                        "0000:0000:0000:0000:0000:ffff:"
                    ):
                        gid = int(g.name)
                        break
            ports.append(
                IBPort(dev.name, int(pdir.name), state, rate, float(m.group(1)) if m else 0.0, link, gid,
                       _numa(dev / "device"))
            )
    return ports


def _numa(pci_dir: Path) -> int:
    """A PCI device's NUMA node; -1 when the kernel does not say (one socket, or no ACPI SRAT)."""
    try:
        return int(_read(pci_dir / "numa_node") or -1)
    except ValueError:
        return -1


def gpu_numa_nodes(sysfs_root: str | Path = "/sys") -> list[int]:
    """NUMA node of each NVIDIA GPU on the PCI bus (vendor 0x10de, class 3D 0x0302xx or VGA
    0x0300xx; NVSwitches are bridges, 0x0680xx). Read from sysfs, so it works without torch,
    the driver or a GPU allocation (CUDA_VISIBLE_DEVICES) on the node."""
    nodes = []
    for dev in sorted(Path(sysfs_root, "bus/pci/devices").glob("*")):
        if _read(dev / "vendor").lower() != "0x10de":
            continue
        if _read(dev / "class").lower().startswith(("0x0302", "0x0300")):
            nodes.append(_numa(dev))
    return nodes


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


def roce_gid_advice(
    ports: list[IBPort], gbps: float, nccl_version: str | None
) -> tuple[dict[str, str], list[Check]]:
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


# ---------------------------------------------------------------- environment checks


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
    task derives it from NCCL_SOCKET_IFNAME (train.dist.set_gloo_ifname): say what it would get."""
    from hpctrain.train.dist import gloo_ifname

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


def in_container(env: Mapping[str, str]) -> bool:
    return (
        bool(env.get("APPTAINER_CONTAINER") or env.get("SINGULARITY_CONTAINER"))
        or Path("/.singularity.d").is_dir()
    )


def container_checks(
    env: Mapping[str, str], ports: list[IBPort], inside: bool, root: str = "/"
) -> list[Check]:
    """~/.local leaks, /dev/infiniband and the verbs provider (checked outside too when IB is up)."""
    checks = []
    home = env.get("HOME", "")
    user_site = Path(
        home, ".local/lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages"
    )
    leaked = sorted(p.name for p in user_site.glob("*")) if home and user_site.is_dir() else []
    if inside:
        if leaked and env.get("PYTHONNOUSERSITE", "") in ("", "0"):
            checks.append(
                Check(
                    "container",
                    "~/.local",
                    "warn",
                    f"{len(leaked)} entries in {user_site} shadow the image: {', '.join(leaked[:5])}",
                    "export PYTHONNOUSERSITE=1 (the hpctrain recipes set it) or run with --no-home",
                )
            )
        else:
            checks.append(
                Check(
                    "container", "~/.local", "ok", "PYTHONNOUSERSITE=1" if leaked else "no user site-packages"
                )
            )
    active = any(p.state == "ACTIVE" for p in ports)
    dev = sorted(Path(root, "dev/infiniband").glob("uverbs*"))
    if inside or active:
        if dev:
            checks.append(Check("container", "/dev/infiniband", "ok", ", ".join(d.name for d in dev)))
        else:
            checks.append(
                Check(
                    "container",
                    "/dev/infiniband",
                    "warn" if active else "info",
                    "not visible",
                    "RDMA devices are not reachable here: NCCL will use TCP; apptainer binds "
                    "/dev by default — check `--contain`/`--no-mount dev`"
                    if inside
                    else "RDMA devices are not reachable here: NCCL will use TCP",
                )
            )
        providers = (
            glob.glob(str(Path(root, "usr/lib/*/libibverbs/lib*-rdmav*.so")))
            + glob.glob(str(Path(root, "usr/lib64/libibverbs/lib*-rdmav*.so")))
            + glob.glob(str(Path(root, "etc/libibverbs.d/*.driver")))
        )
        names = sorted({re.sub(r"^lib|-rdmav\d+\.so$|\.driver$", "", Path(p).name) for p in providers})
        if names:
            mlx = [n for n in names if n.startswith("mlx")]
            checks.append(
                Check(
                    "container",
                    "verbs provider",
                    "ok" if mlx or not active else "warn",
                    ", ".join(names),
                    "" if mlx or not active else "no mlx4/mlx5 provider",
                )
            )
        else:
            checks.append(
                Check(
                    "container",
                    "verbs provider",
                    "fail" if active else "info",
                    "none",
                    "install rdma-core's ibverbs-providers in the image (NGC images have it); "
                    "without it NCCL silently falls back to TCP sockets",
                )
            )
    return checks


def version_checks(v: Mapping[str, str | None], gpu_names: list[str]) -> list[Check]:
    checks = []
    py = tuple(int(x) for x in (v["python"] or "0.0").split(".")[:2])
    checks.append(
        Check(
            "versions",
            "python",
            "ok" if py >= (3, 10) else "fail",
            v["python"] or "?",
            "" if py >= (3, 10) else "hpctrain needs Python ≥ 3.10",
        )
    )
    torch_v = v["torch"]
    if torch_v is None:
        checks.append(
            Check(
                "versions",
                "torch",
                "info",
                "not installed",
                "fine on a login node; training needs `pip install hpctrain[train]` or the image",
            )
        )
    elif torch_v.startswith("broken"):
        checks.append(Check("versions", "torch", "fail", torch_v, "reinstall torch or use the image"))
    else:
        build = f"CUDA {v['cuda']}" if v["cuda"] else "CPU build"
        status, hint = "ok", ""
        if gpu_names and not v["cuda"]:
            status, hint = (
                "fail",
                "GPUs are visible but torch is a CPU build: install a CUDA build or use the image",
            )
        elif gpu_names and v.get("torch_cuda_available") is False:
            status, hint = (
                "fail",
                (
                    f"GPUs are present but torch (CUDA {v['cuda']}) cannot use them: driver too old, "
                    "CUDA_VISIBLE_DEVICES, or a container started without --nv"
                ),
            )
        checks.append(Check("versions", "torch", status, f"{torch_v} ({build})", hint))
        if v["cuda"]:
            checks.append(Check("versions", "cudnn", "ok" if v["cudnn"] else "warn", v["cudnn"] or "none"))
            checks.append(
                Check(
                    "versions",
                    "nccl",
                    "ok" if v["nccl"] else "warn",
                    v["nccl"] or "none",
                    "" if v["nccl"] else "torch has no NCCL: multi-GPU training will use gloo",
                )
            )
    drv = v["driver"]
    if drv and v["cuda"]:
        major = int(v["cuda"].split(".")[0])
        need = MIN_DRIVER.get(major)
        have = tuple(int(x) for x in drv.split(".")[:2])
        ok = need is None or have >= need
        checks.append(
            Check(
                "versions",
                "driver",
                "ok" if ok else "fail",
                drv,
                ""
                if ok
                else f"CUDA {v['cuda']} needs driver ≥ {need[0]}.{need[1]}: use an image with an "
                "older CUDA or ask for a driver update",
            )
        )
    elif drv:
        checks.append(Check("versions", "driver", "ok", drv))
    if v["dali"] is None:
        checks.append(
            Check("versions", "dali", "info", "not installed", "the torch (PIL) loader works without it")
        )
    else:
        pkgs = (v["dali_package"] or "").split(", ")
        status, hint = "ok", ""
        if len(pkgs) > 1:
            status, hint = (
                "warn",
                "several DALI packages installed: keep one (in NGC images, the one NGC ships)",
            )
        else:
            m = re.search(r"cuda(\d+)", pkgs[0])
            if m and v["cuda"] and int(m.group(1)[:-1]) != int(v["cuda"].split(".")[0]):
                status, hint = (
                    "warn",
                    f"{pkgs[0]} is built for CUDA {m.group(1)[:-1]} but torch for CUDA {v['cuda']}",
                )
        checks.append(Check("versions", "dali", status, f"{v['dali']} ({v['dali_package']})", hint))
    if gpu_names:
        checks.append(Check("gpu", "gpus", "ok", f"{len(gpu_names)}: " + ", ".join(sorted(set(gpu_names)))))
    else:
        hint = (
            "CUDA_VISIBLE_DEVICES is empty"
            if os.environ.get("CUDA_VISIBLE_DEVICES") == ""
            else "fine on a login node; on a GPU node check the allocation (--gpus) and `--nv` for containers"
        )
        checks.append(Check("gpu", "gpus", "info", "none visible", hint))
    return checks


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
    return Check("limits", "locked memory", "warn" if hard != resource.RLIM_INFINITY else "info", value,
                 "NCCL over InfiniBand/RoCE locks its buffers: a job inherits this shell's limit (Slurm "
                 "PropagateResourceLimits) and hpctrain's batch script raises it only up to the hard limit; ask the "
                 "admins for `memlock unlimited` (limits.conf, and slurmd's own) or "
                 "PropagateResourceLimitsExcept=MEMLOCK (Slurm FAQ, #memlock)")


def runtime_checks() -> list[Check]:
    """The container runtimes this node has (apptainer, SingularityCE, pyxis): what container.runtime
    can be here (launch/runtimes.py says how each is told apart)."""
    found = runtimes.detect()
    if not found:
        return [Check("container", "runtime", "info", "none of apptainer, singularity, pyxis on PATH",
                      "tasks run on the host's Python (container.runtime none), or `module load` the "
                      "site's apptainer/singularity first")]
    return [Check("container", f"runtime {f.runtime}", "ok", f.evidence) for f in found]


def run(sysfs_root: str | Path = "/sys", env: Mapping[str, str] | None = None, root: str = "/") -> Report:
    env = os.environ if env is None else env
    v = versions()
    gpu_names = gpus()
    ports = ib_ports(sysfs_root)
    gpu_numa = gpu_numa_nodes(sysfs_root)
    suggested, ib_checks = suggest_nccl(ports, gpu_numa, v["nccl"])
    inside = in_container(env)
    checks = version_checks(v, gpu_names) + ib_checks
    checks += nccl_env_checks(env, ports, interfaces(sysfs_root), gpu_numa)
    checks += container_checks(env, ports, inside, root)
    if not inside:  # inside an image no runtime starts another
        checks += runtime_checks()
    checks.append(memlock_check(*resource.getrlimit(resource.RLIMIT_MEMLOCK), rdma=bool(ports)))
    return Report(v, gpu_names, ports, suggested, inside, checks, gpu_numa=gpu_numa)


def profile_lines(suggested: Mapping[str, str]) -> list[str]:
    """The suggested NCCL_* values as the profile keys that export them (launch/nccl.py)."""
    out = []
    if "NCCL_IB_HCA" in suggested:
        out.append(f"    hcas: [{', '.join(suggested['NCCL_IB_HCA'].lstrip('=').split(','))}]")
    if "NCCL_IB_GID_INDEX" in suggested:
        out.append(f"    gid_index: {suggested['NCCL_IB_GID_INDEX']}")
    return out


def format_report(r: Report) -> str:
    width = max(len(c.name) for c in r.checks)
    where = "inside a container" if r.in_container else "on the host"
    lines = [f"hpctrain doctor — {platform.node()} ({where})", ""]
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
        from hpctrain.allreduce import format_rows

        lines += ["", format_rows(r.allreduce)]
    n_fail = sum(c.status == "fail" for c in r.checks)
    n_warn = sum(c.status == "warn" for c in r.checks)
    lines += ["", f"{n_fail} problem(s), {n_warn} warning(s)"]
    return "\n".join(lines)

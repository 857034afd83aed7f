"""Fake sysfs trees of real nodes (a DGX H100, an InfiniBand node, RoCE nodes) for the doctor
and `cluster init --probe` tests, and the CLI run in this process."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.cli import main


def run_cli(capsys, *args) -> tuple[int, str]:
    """The CLI in this process (torch is already imported here; a subprocess would pay again)."""
    rc = main(list(args))
    return rc, capsys.readouterr().out


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def port(root: Path, dev: str, n: int, state: str, rate: str, link: str, gids=(), numa: int | None = None) -> None:
    """One HCA port as the kernel shows it; `numa` writes <dev>/device/numa_node (the PCI device)."""
    p = root / "class/infiniband" / dev / "ports" / str(n)
    write(p / "state", state)
    write(p / "rate", rate)
    write(p / "link_layer", link)
    for i, (gid, kind) in enumerate(gids):
        write(p / "gids" / str(i), gid)
        write(p / "gid_attrs/types" / str(i), kind)
    if numa is not None:
        write(root / "class/infiniband" / dev / "device/numa_node", str(numa))


def pci(root: Path, bdf: str, vendor: str, cls: str, numa: int) -> None:
    """A PCI function under <sysfs>/bus/pci/devices (vendor, class, numa_node as sysfs writes them)."""
    d = root / "bus/pci/devices" / bdf
    write(d / "vendor", vendor)
    write(d / "class", cls)
    write(d / "numa_node", str(numa))


def netif(root: Path, name: str, state: str = "up") -> None:
    write(root / "class/net" / name / "operstate", state)


NDR = "400 Gb/sec (4X NDR)"


DGX_COMPUTE = ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]


DGX_STORAGE = ["mlx5_1", "mlx5_2", "mlx5_7", "mlx5_8"]


@pytest.fixture
def dgx_h100(tmp_path) -> Path:
    """A DGX H100 as sysfs shows it: 8 H100s (3D controllers) on NUMA 0 and 1, 4 NVSwitches (PCI
    bridges, also vendor 0x10de), 12 mlx5 HCAs all ACTIVE at 400 Gb/s InfiniBand: the 8 compute
    rails beside the GPUs, the storage/in-band ones on NUMA nodes 2 and 3 where no GPU is. Only
    NUMA proximity tells them apart (same link layer, same rate). IPoIB is ibp24s0 …, no ib0."""
    root = tmp_path / "sys"
    for i, bdf in enumerate(["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]):
        pci(root, f"0000:{bdf}:00.0", "0x10de", "0x030200", 0 if i < 4 else 1)
    for i, bdf in enumerate(["05", "06", "07", "08"]):
        pci(root, f"0000:{bdf}:00.0", "0x10de", "0x068000", 2 + i % 2)  # NVSwitch: not a GPU
    pci(root, "0000:29:00.0", "0x15b3", "0x020700", 2)  # a ConnectX function: not a GPU
    for i, dev in enumerate(DGX_COMPUTE):
        port(root, dev, 1, "4: ACTIVE", NDR, "InfiniBand", numa=0 if i < 4 else 1)
    for i, dev in enumerate(DGX_STORAGE):
        port(root, dev, 1, "4: ACTIVE", NDR, "InfiniBand", numa=2 + i % 2)
    for name in ("lo", "eno3", "ibp24s0", "ibp64s0", "docker0"):
        netif(root, name, "unknown" if name == "lo" else "up")
    return root


LINK_LOCAL = "fe80:0000:0000:0000:0a42:a1ff:fe65:1f3a"


IPV6 = "2001:0db8:0000:0002:0a42:a1ff:fe65:1f3a"


IPV4 = "0000:0000:0000:0000:0000:ffff:0a00:0005"


@pytest.fixture
def roce_ipv6_node(tmp_path) -> Path:
    """RoCE v2 with a global IPv6 address: index 3 is the IPv6 RoCE v2 GID, the IPv4-mapped RoCE v2
    GID is index 5 (a forced NCCL_IB_GID_INDEX=3 would pick IPv6)."""
    root = tmp_path / "sys"
    table = [
        (LINK_LOCAL, "IB/RoCE v1"),
        (LINK_LOCAL, "RoCE v2"),
        (IPV6, "IB/RoCE v1"),
        (IPV6, "RoCE v2"),
        (IPV4, "IB/RoCE v1"),
        (IPV4, "RoCE v2"),
    ]
    port(root, "mlx5_0", 1, "4: ACTIVE", "100 Gb/sec (2X HDR)", "Ethernet", table, numa=0)
    pci(root, "0000:18:00.0", "0x10de", "0x030200", 0)
    for name in ("lo", "ens1f0np0"):
        netif(root, name)
    return root


@pytest.fixture
def ib_node(tmp_path) -> Path:
    """mlx5_0 port 1: ACTIVE, 200 Gb/s HDR InfiniBand; a DOWN port and a 25 Gb/s Ethernet NIC beside it."""
    root = tmp_path / "sys"
    port(
        root,
        "mlx5_0",
        1,
        "4: ACTIVE",
        "200 Gb/sec (4X HDR)",
        "InfiniBand",
        [("fe80:0000:0000:0000:0c42:a103:0065:1f3a", "IB/RoCE v1")],
    )
    port(root, "mlx5_1", 1, "1: DOWN", "10 Gb/sec (4X SDR)", "InfiniBand")
    port(root, "mlx5_2", 1, "4: ACTIVE", "25 Gb/sec (1X EDR)", "Ethernet")
    for i in ("lo", "eth0", "ib0"):
        (root / "class/net" / i).mkdir(parents=True)
    return root


@pytest.fixture
def roce_node(tmp_path) -> Path:
    """mlx5_0 port 1: ACTIVE 100 Gb/s Ethernet (RoCE); RoCE v2 with the IPv4 address is GID 3."""
    root = tmp_path / "sys"
    link_local = "fe80:0000:0000:0000:0a42:a1ff:fe65:1f3a"
    v4 = "0000:0000:0000:0000:0000:ffff:0a00:0005"
    port(
        root,
        "mlx5_0",
        1,
        "4: ACTIVE",
        "100 Gb/sec (2X HDR)",
        "Ethernet",
        [(link_local, "IB/RoCE v1"), (link_local, "RoCE v2"), (v4, "IB/RoCE v1"), (v4, "RoCE v2")],
    )
    for i in ("lo", "ens1f0"):
        (root / "class/net" / i).mkdir(parents=True)
    return root

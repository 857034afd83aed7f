"""`hpctrain doctor`: this machine (no GPU, no InfiniBand), fake sysfs trees of IB and RoCE nodes,
NCCL environment mistakes, container leaks, and a 2-process gloo all-reduce."""

from __future__ import annotations

import json
import logging
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from hpctrain import doctor
from hpctrain.allreduce import format_rows, parse_size
from hpctrain.launch.nccl import fabric_env, hca_matches
from hpctrain.launch.profile import load_profile
from hpctrain.train.dist import set_gloo_ifname
from tests.helpers import hpctrain


def run_cli(capsys, *args) -> tuple[int, str]:
    """The CLI in this process (torch is already imported here; a subprocess would pay again)."""
    from hpctrain.cli import main

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
    table = [(LINK_LOCAL, "IB/RoCE v1"), (LINK_LOCAL, "RoCE v2"), (IPV6, "IB/RoCE v1"), (IPV6, "RoCE v2"),
             (IPV4, "IB/RoCE v1"), (IPV4, "RoCE v2")]
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


def test_this_machine_no_gpu_no_ib_and_versions():
    import torch

    r = hpctrain("doctor", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["gpus"] == [] and rep["ports"] == [] and rep["suggested_env"] == {} and rep["ok"] is True
    v = rep["versions"]
    assert v["python"] == platform.python_version() and v["torch"] == torch.__version__
    assert (
        v["cuda"] is None and v["nccl"] is None and v["cudnn"] is None and v["torch_cuda_available"] is False
    )
    assert v["dali"] == metadata.version("nvidia-dali-cuda120") and v["dali_package"] == "nvidia-dali-cuda120"
    text = doctor.format_report(doctor.run())
    assert "INFO  gpus" in text and "none visible" in text
    assert "none (no /sys/class/infiniband)" in text and f"{torch.__version__} (CPU build)" in text


def test_login_node_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from hpctrain.cli import main\n"
        "rc = main(['doctor', '--json'])\n"
        "assert 'torch' not in [m for m, v in sys.modules.items() if v is not None]\n"
        "raise SystemExit(rc)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["versions"]["torch"] is None
    torch_check = next(c for c in rep["checks"] if c["name"] == "torch")
    assert torch_check["status"] == "info" and torch_check["value"] == "not installed"


def test_infiniband_node_suggests_hca(ib_node, capsys):
    rc, out = run_cli(capsys, "doctor", "--json", "--sysfs-root", str(ib_node))
    rep = json.loads(out)
    assert rep["suggested_env"] == {"NCCL_IB_HCA": "=mlx5_0:1"}  # not the DOWN port, not the 25 Gb/s NIC
    ports = {(p["device"], p["port"]): p for p in rep["ports"]}
    assert ports["mlx5_0", 1]["state"] == "ACTIVE" and ports["mlx5_0", 1]["gbps"] == 200.0
    assert ports["mlx5_0", 1]["link_layer"] == "InfiniBand"
    text = run_cli(capsys, "doctor", "--sysfs-root", str(ib_node))[1]
    assert "export NCCL_IB_HCA==mlx5_0:1" in text and "NCCL_IB_GID_INDEX" in text  # "leave it unset"
    assert "  fabric:\n    hcas: [mlx5_0:1]" in text  # the same as a profile names it
    assert "InfiniBand needs no GID index" in text
    assert "WARN  mlx5_1:1" in text and "DOWN" in text


def test_roce_node_needs_gid_index(roce_node):
    rep = doctor.run(roce_node, env={})
    assert rep.suggested_env == {"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_IB_GID_INDEX": "3"}
    fabric = next(c for c in rep.checks if c.name == "fabric")
    assert fabric.status == "ok" and "RoCE needs NCCL_IB_GID_INDEX=3" in fabric.hint


def test_roce_without_ipv4_gid_warns(tmp_path):
    port(
        tmp_path,
        "mlx5_0",
        1,
        "4: ACTIVE",
        "100 Gb/sec (2X HDR)",
        "Ethernet",
        [("fe80:0000:0000:0000:0a42:a1ff:fe65:1f3a", "RoCE v2")],
    )
    rep = doctor.run(tmp_path, env={})
    assert "NCCL_IB_GID_INDEX" not in rep.suggested_env
    assert any(c.name == "fabric" and c.status == "warn" and "no RoCE v2 GID" in c.hint for c in rep.checks)


def test_dgx_h100_suggests_only_the_gpu_near_compute_rails(dgx_h100):
    """12 ACTIVE 400 Gb/s HCAs: the 4 on NUMA nodes without a GPU (storage/in-band) are left out."""
    rep = doctor.run(dgx_h100, env={})
    assert rep.gpu_numa == [0, 0, 0, 0, 1, 1, 1, 1]  # the H100s; not the NVSwitches, not the NIC
    assert rep.suggested_env == {"NCCL_IB_HCA": "=" + ",".join(f"{d}:1" for d in DGX_COMPUTE)}
    near = next(c for c in rep.checks if c.name == "GPU-near ports")
    assert near.status == "ok" and near.value == "8 of 12 on the GPUs' NUMA nodes (0,1)"
    assert all(f"{d}:1 (NUMA " in near.hint for d in DGX_STORAGE) and "storage or in-band" in near.hint
    ports = {p.name: p for p in rep.ports}
    assert (ports["mlx5_10:1"].numa_node, ports["mlx5_7:1"].numa_node) == (1, 2)
    # the suggestion, written into a profile, is exported exactly as suggested
    hcas = rep.suggested_env["NCCL_IB_HCA"].lstrip("=")
    env = fabric_env(load_profile("example-ib", [f"fabric.hcas=[{hcas}]"]))
    assert env["NCCL_IB_HCA"] == rep.suggested_env["NCCL_IB_HCA"]
    assert [c.status for c in doctor.nccl_env_checks(env, rep.ports, [], rep.gpu_numa) if c.name == "NCCL_IB_HCA"] \
        == ["ok"]


def test_dgx_h100_bare_hca_name_is_a_prefix_of_other_rails(dgx_h100):
    """NCCL_IB_HCA=mlx5_1 also selects mlx5_10 and mlx5_11 (compute rails of other GPUs); the
    profile writes the exact form, which selects mlx5_1 alone."""
    ports, numa = doctor.ib_ports(dgx_h100), doctor.gpu_numa_nodes(dgx_h100)
    devices = {p.device for p in ports}
    assert hca_matches("mlx5_1", devices) == {"mlx5_1": ["mlx5_1", "mlx5_10", "mlx5_11"]}
    exported = fabric_env(load_profile("example-ib", ["fabric.hcas=[mlx5_1]"]))["NCCL_IB_HCA"]
    assert exported == "=mlx5_1:1" and hca_matches(exported, devices) == {"mlx5_1:1": ["mlx5_1"]}
    bare = doctor.hca_check("mlx5_1", ports, numa)
    assert bare.status == "warn" and "mlx5_1 also selects mlx5_10, mlx5_11; write =mlx5_1:1" in bare.hint
    assert "mlx5_1:1 (NUMA 2): no GPU on that NUMA node" in bare.hint
    exact = doctor.hca_check(exported, ports, numa)
    assert exact.status == "warn" and "prefix" not in exact.hint and "mlx5_1:1 (NUMA 2)" in exact.hint
    assert doctor.hca_check("=mlx5_0:2", ports, numa).status == "fail"  # no port 2 on mlx5_0


def test_doctor_checks_a_profile_against_the_node(dgx_h100, capsys, monkeypatch):
    """`doctor --cluster P` checks what P's jobs export on this node (the old example-ib listed
    mlx5_0..7: a prefix of mlx5_10/11 and two storage rails on a DGX H100)."""
    for k in ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_GID_INDEX"):
        monkeypatch.delenv(k, raising=False)
    def nccl_checks(*args: str) -> dict[str, dict]:
        out = run_cli(capsys, "doctor", "--json", "--sysfs-root", str(dgx_h100), "--cluster", "example-ib", *args)[1]
        return {c["name"]: c for c in json.loads(out)["checks"] if c["section"] == "nccl"}

    assert list(nccl_checks()) == ["environment"]  # nothing named: nothing to get wrong
    old = "fabric.hcas=[mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7]"
    c = nccl_checks("--cluster-set", old, "--cluster-set", "fabric.ifname=ib0")
    hca = c["NCCL_IB_HCA"]
    assert hca["status"] == "warn" and hca["value"].startswith("=mlx5_0:1,mlx5_1:1,mlx5_2:1")
    assert "mlx5_2:1 (NUMA 3)" in hca["hint"] and "mlx5_7:1 (NUMA 2)" in hca["hint"]
    assert c["NCCL_SOCKET_IFNAME"]["status"] == "fail" and "ibp24s0" in c["NCCL_SOCKET_IFNAME"]["hint"]
    compute = "fabric.hcas=[" + ",".join(DGX_COMPUTE) + "]"
    c = nccl_checks("--cluster-set", compute, "--cluster-set", "fabric.ifname=ibp")
    assert {n: v["status"] for n, v in c.items()} == \
        {"NCCL_SOCKET_IFNAME": "ok", "GLOO_SOCKET_IFNAME": "ok", "NCCL_IB_HCA": "ok"}


def test_ipoib_named_ibp24s0_not_ib0(dgx_h100, monkeypatch, caplog):
    """IPoIB is ibp24s0 here: ib0 fails NCCL; the profile's NCCL pattern reaches NCCL only, and
    each task derives a plain gloo name from it on its own node."""
    ifaces = doctor.interfaces(dgx_h100)
    assert ifaces == ["docker0", "eno3", "ibp24s0", "ibp64s0", "lo"]

    def checks(env):
        return {c.name: c for c in doctor.nccl_env_checks(env, [], ifaces)}

    c = checks({"NCCL_SOCKET_IFNAME": "ib0"})
    assert c["NCCL_SOCKET_IFNAME"].status == "fail" and c["GLOO_SOCKET_IFNAME"].value == "left unset"
    c = checks({"NCCL_SOCKET_IFNAME": "ibp"})
    assert c["NCCL_SOCKET_IFNAME"].status == "ok" and c["GLOO_SOCKET_IFNAME"].value.startswith("ibp24s0 ")
    for bad in ("ibp", "=ibp24s0", "^docker,lo", "ib0"):  # gloo takes plain names of this node only
        c = checks({"NCCL_SOCKET_IFNAME": "ibp", "GLOO_SOCKET_IFNAME": bad})
        assert c["GLOO_SOCKET_IFNAME"].status == "fail" and "plain names" in c["GLOO_SOCKET_IFNAME"].hint
    assert checks({"GLOO_SOCKET_IFNAME": "ibp64s0"})["GLOO_SOCKET_IFNAME"].status == "ok"

    env = fabric_env(load_profile("example-ib", ["fabric.ifname=ibp"]))
    assert env["NCCL_SOCKET_IFNAME"] == "ibp" and "GLOO_SOCKET_IFNAME" not in env
    assert set_gloo_ifname(env, dgx_h100) == "ibp24s0" and env["GLOO_SOCKET_IFNAME"] == "ibp24s0"
    assert set_gloo_ifname({**env, "GLOO_SOCKET_IFNAME": "eno3"}, dgx_h100) is None  # set already: kept
    netif(dgx_h100, "ibp24s0", "down")
    assert set_gloo_ifname({"NCCL_SOCKET_IFNAME": "ibp"}, dgx_h100) == "ibp64s0"  # an up one
    monkeypatch.setattr(logging.getLogger("hpctrain"), "propagate", True)
    task = {"NCCL_SOCKET_IFNAME": "=ib0"}
    with caplog.at_level(logging.WARNING, logger="hpctrain"):
        assert set_gloo_ifname(task, dgx_h100) is None and "GLOO_SOCKET_IFNAME" not in task
    assert "GLOO_SOCKET_IFNAME left unset" in caplog.text and "NCCL_SOCKET_IFNAME==ib0" in caplog.text


def test_roce_ipv6_gid_at_index_3_gets_its_own_index(roce_ipv6_node):
    """GID 3 is IPv6 here: the RoCE v2 IPv4 GID is 5. NCCL >= 2.21 finds it (no variable); for
    older NCCL the doctor names 5, which the profile sets as fabric.gid_index."""
    ports = doctor.ib_ports(roce_ipv6_node)
    assert [(p.name, p.roce_v2_gid, p.numa_node) for p in ports] == [("mlx5_0:1", 5, 0)]
    env, checks = doctor.suggest_nccl(ports, [0], "2.19.3")  # NGC 23.12's NCCL
    fabric = next(c for c in checks if c.name == "fabric")
    assert env == {"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_IB_GID_INDEX": "5"}
    assert "mlx5_0:1 → 5" in fabric.value and "fabric.gid_index: 5" in fabric.hint
    assert next(c for c in checks if c.name == "mlx5_0:1").value.endswith("RoCE v2 GID 5")
    env, checks = doctor.suggest_nccl(ports, [0], "2.21.5")
    assert env == {"NCCL_IB_HCA": "=mlx5_0:1"}
    assert "leave NCCL_IB_GID_INDEX unset" in next(c for c in checks if c.name == "fabric").hint
    assert "NCCL_IB_GID_INDEX" not in fabric_env(load_profile("example-roce"))  # never a forced 3
    assert fabric_env(load_profile("example-roce", ["fabric.gid_index=5"]))["NCCL_IB_GID_INDEX"] == "5"


def test_roce_ports_with_different_gid_tables_get_no_single_index(roce_ipv6_node):
    """Per-port advice, not the minimum over ports: one NCCL_IB_GID_INDEX cannot fit 5 and 3."""
    plain = [(LINK_LOCAL, "IB/RoCE v1"), (LINK_LOCAL, "RoCE v2"), (IPV4, "IB/RoCE v1"), (IPV4, "RoCE v2")]
    port(roce_ipv6_node, "mlx5_1", 1, "4: ACTIVE", "100 Gb/sec (2X HDR)", "Ethernet", plain, numa=0)
    rep = doctor.run(roce_ipv6_node, env={})  # torch here is a CPU build: NCCL version unknown
    assert rep.suggested_env == {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1"}
    fabric = next(c for c in rep.checks if c.name == "fabric")
    assert fabric.status == "warn" and "mlx5_0:1 → 5, mlx5_1:1 → 3" in fabric.value
    assert "GID tables differ" in fabric.hint
    env, checks = doctor.suggest_nccl(rep.ports, rep.gpu_numa, "2.23.4")
    assert "NCCL_IB_GID_INDEX" not in env and next(c for c in checks if c.name == "fabric").status == "ok"


def test_nccl_env_mistakes(ib_node, capsys, monkeypatch):
    for k, v in {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "enp", "NCCL_IB_HCA": "mlx5_7"}.items():
        monkeypatch.setenv(k, v)
    rc, out = run_cli(capsys, "doctor", "--sysfs-root", str(ib_node))
    assert rc == 1
    assert "WARN  NCCL_DEBUG" in out and "left on" in out
    assert "FAIL  NCCL_SOCKET_IFNAME" in out and "this node has: eth0, ib0, lo" in out
    assert "FAIL  NCCL_IB_HCA" in out and "mlx5_7 not on this node" in out
    ok = doctor.nccl_env_checks({"NCCL_SOCKET_IFNAME": "eth,ib"}, [], ["eth0", "lo"])
    assert [(c.name, c.status) for c in ok] == [("NCCL_SOCKET_IFNAME", "ok"), ("GLOO_SOCKET_IFNAME", "ok")]
    assert ok[1].value.startswith("eth0 ")
    excl = doctor.nccl_env_checks({"NCCL_SOCKET_IFNAME": "^docker,lo"}, [], ["lo"])
    assert [(c.name, c.value) for c in excl] == [("GLOO_SOCKET_IFNAME", "left unset")]  # never lo for gloo
    assert doctor.nccl_env_checks({"NCCL_SOCKET_IFNAME": "=eth"}, [], ["eth0"])[0].status == "fail"
    assert doctor.nccl_env_checks({"NCCL_SOCKET_IFNAME": "=eth0"}, [], ["eth0"])[0].status == "ok"


def test_container_checks(tmp_path, ib_node):
    home = tmp_path / "home"
    site = home / ".local/lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (site / "numpy").mkdir(parents=True)
    ports = doctor.ib_ports(ib_node)
    env = {"HOME": str(home), "APPTAINER_CONTAINER": "/img.sif"}
    bare = tmp_path / "root"
    bare.mkdir()
    by_name = {c.name: c for c in doctor.container_checks(env, ports, inside=True, root=str(bare))}
    assert by_name["~/.local"].status == "warn" and "numpy" in by_name["~/.local"].value
    assert by_name["/dev/infiniband"].status == "warn"
    assert (
        by_name["verbs provider"].status == "fail" and "falls back to TCP" in by_name["verbs provider"].hint
    )
    node = tmp_path / "node"
    (node / "dev/infiniband").mkdir(parents=True)
    (node / "dev/infiniband/uverbs0").touch()
    write(node / "usr/lib/x86_64-linux-gnu/libibverbs/libmlx5-rdmav34.so", "")
    env["PYTHONNOUSERSITE"] = "1"
    by_name = {c.name: c for c in doctor.container_checks(env, ports, inside=True, root=str(node))}
    assert {n: c.status for n, c in by_name.items()} == {
        "~/.local": "ok",
        "/dev/infiniband": "ok",
        "verbs provider": "ok",
    }
    assert by_name["verbs provider"].value == "mlx5"
    assert doctor.in_container(env) and not doctor.in_container({})


def test_version_fit_rules(tmp_path):
    base = {
        "python": "3.11.7",
        "hpctrain": "0.1.0",
        "torch": "2.2.0",
        "cuda": "12.3",
        "cudnn": "8.9.7",
        "nccl": "2.19.3",
        "dali": "1.32.0",
        "dali_package": "nvidia-dali-cuda120",
        "driver": "470.82.01",
    }
    st = {c.name: c for c in doctor.version_checks(base, ["NVIDIA H100"])}
    assert st["driver"].status == "fail" and "needs driver ≥ 525.60" in st["driver"].hint
    st = {
        c.name: c for c in doctor.version_checks({**base, "driver": "535.104.05", "cuda": "11.8"}, ["A100"])
    }
    assert st["driver"].status == "ok" and st["dali"].status == "warn" and "CUDA 12" in st["dali"].hint
    st = {c.name: c for c in doctor.version_checks({**base, "cuda": None}, ["A100"])}
    assert st["torch"].status == "fail" and "CPU build" in st["torch"].hint
    st = {c.name: c for c in doctor.version_checks({**base, "torch_cuda_available": False}, ["A100"])}
    assert st["torch"].status == "fail" and "cannot use them" in st["torch"].hint
    st = {c.name: c for c in doctor.version_checks({**base, "torch_cuda_available": True}, ["A100"])}
    assert st["torch"].status == "ok" and st["nccl"].value == "2.19.3" and st["cudnn"].value == "8.9.7"
    two = {**base, "dali_package": "nvidia-dali-cuda110, nvidia-dali-cuda120", "dali": "1.30, 1.32"}
    assert {c.name: c for c in doctor.version_checks(two, [])}["dali"].status == "warn"
    write(
        tmp_path / "driver/nvidia/version",
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023",
    )
    assert doctor.driver_version(str(tmp_path)) == "535.104.05"


def test_allreduce_two_gloo_processes(capsys):
    rc, out = run_cli(
        capsys, "doctor", "--allreduce", "--procs", "2", "--sizes", "4K,64K,1M", "--iters", "3", "--json"
    )
    assert rc == 0
    rep = json.loads(out)
    rows = rep["allreduce"]
    # the table `hpctrain doctor --allreduce` prints
    table = format_rows(rows).splitlines()
    assert table[0] == "all-reduce over 2 ranks (float32 sum)"
    assert table[1].split() == ["size", "time", "(us)", "algbw", "(GB/s)", "busbw", "(GB/s)"]
    assert [ln.split()[0] for ln in table[2:5]] == ["4K", "64K", "1M"]
    assert [row["bytes"] for row in rows] == [4096, 65536, 1 << 20]
    assert all(row["ranks"] == 2 and row["busbw_GBps"] > 0 and row["time_us"] > 0 for row in rows)
    # 2 ranks: bus bandwidth equals algorithm bandwidth (factor 2(n-1)/n = 1)
    assert all(abs(row["busbw_GBps"] - row["algbw_GBps"]) < 1e-12 for row in rows)


def test_allreduce_needs_ranks_and_sizes(capsys):
    from hpctrain.cli import main

    assert main(["doctor", "--allreduce", "--procs", "1"]) == 2
    assert "run under torchrun/srun, or pass --procs 2" in capsys.readouterr().err
    assert main(["doctor", "--allreduce", "--sizes", "12Q"]) == 2
    assert "bad size '12Q'" in capsys.readouterr().err
    assert parse_size("64K") == 65536 and parse_size("1.5M") == 1572864 and parse_size("2G") == 2 << 30


def test_locked_memory_limit_of_a_login_node_warns_on_rdma_nodes():
    import resource

    inf = resource.RLIM_INFINITY
    assert doctor.memlock_check(inf, inf, rdma=True).status == "ok"
    c = doctor.memlock_check(64 * 1024, 64 * 1024, rdma=True)
    assert c.status == "warn" and c.value == "64 KiB (hard limit 64 KiB)" and "PropagateResourceLimits" in c.hint
    assert doctor.memlock_check(64 * 1024, inf, rdma=True).status == "info"  # the batch script raises it
    assert doctor.memlock_check(64 * 1024, 64 * 1024, rdma=False).status == "info"
    assert any(c.name == "locked memory" for c in doctor.run().checks)

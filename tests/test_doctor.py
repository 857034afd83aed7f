"""`hpctrain doctor`: this machine (no GPU, no InfiniBand), fake sysfs trees of IB and RoCE nodes,
NCCL environment mistakes, container leaks, and a 2-process gloo all-reduce."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from hpctrain import doctor
from hpctrain.allreduce import format_rows, parse_size
from tests.helpers import hpctrain


def run_cli(capsys, *args) -> tuple[int, str]:
    """The CLI in this process (torch is already imported here; a subprocess would pay again)."""
    from hpctrain.cli import main

    rc = main(list(args))
    return rc, capsys.readouterr().out




def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def port(root: Path, dev: str, n: int, state: str, rate: str, link: str, gids=()) -> None:
    p = root / "class/infiniband" / dev / "ports" / str(n)
    write(p / "state", state)
    write(p / "rate", rate)
    write(p / "link_layer", link)
    for i, (gid, kind) in enumerate(gids):
        write(p / "gids" / str(i), gid)
        write(p / "gid_attrs/types" / str(i), kind)


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


def test_nccl_env_mistakes(ib_node, capsys, monkeypatch):
    for k, v in {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "enp", "NCCL_IB_HCA": "mlx5_7"}.items():
        monkeypatch.setenv(k, v)
    rc, out = run_cli(capsys, "doctor", "--sysfs-root", str(ib_node))
    assert rc == 1
    assert "WARN  NCCL_DEBUG" in out and "left on" in out
    assert "FAIL  NCCL_SOCKET_IFNAME" in out and "this node has: eth0, ib0, lo" in out
    assert "FAIL  NCCL_IB_HCA" in out and "mlx5_7 not on this node" in out
    ok = doctor.nccl_env_checks({"NCCL_SOCKET_IFNAME": "eth,ib"}, [], ["eth0", "lo"])
    assert [c.status for c in ok] == ["ok"]
    assert doctor.nccl_env_checks({"NCCL_SOCKET_IFNAME": "^docker,lo"}, [], ["lo"])[0].name == "environment"
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

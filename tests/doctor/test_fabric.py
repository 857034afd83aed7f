"""doctor/fabric.py: which InfiniBand/RoCE ports NCCL should use, on fake sysfs trees of real nodes."""

from __future__ import annotations

import json

from hpctrain.doctor.env import nccl_env_checks
from hpctrain.doctor.fabric import ib_ports, suggest_nccl
from hpctrain.doctor.report import run
from hpctrain.site.fabric import fabric_env
from hpctrain.site.profile import load_profile
from tests.doctor.fake_sysfs import DGX_COMPUTE, DGX_STORAGE, IPV4, LINK_LOCAL, port, run_cli


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
    rep = run(roce_node, env={})
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
    rep = run(tmp_path, env={})
    assert "NCCL_IB_GID_INDEX" not in rep.suggested_env
    assert any(c.name == "fabric" and c.status == "warn" and "no RoCE v2 GID" in c.hint for c in rep.checks)


def test_dgx_h100_suggests_only_the_gpu_near_compute_rails(dgx_h100):
    """12 ACTIVE 400 Gb/s HCAs: the 4 on NUMA nodes without a GPU (storage/in-band) are left out."""
    rep = run(dgx_h100, env={})
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
    assert [c.status for c in nccl_env_checks(env, rep.ports, [], rep.gpu_numa) if c.name == "NCCL_IB_HCA"] == ["ok"]


def test_roce_ipv6_gid_at_index_3_gets_its_own_index(roce_ipv6_node):
    """GID 3 is IPv6 here: the RoCE v2 IPv4 GID is 5. NCCL >= 2.21 finds it (no variable); for
    older NCCL the doctor names 5, which the profile sets as fabric.gid_index."""
    ports = ib_ports(roce_ipv6_node)
    assert [(p.name, p.roce_v2_gid, p.numa_node) for p in ports] == [("mlx5_0:1", 5, 0)]
    env, checks = suggest_nccl(ports, [0], "2.19.3")  # NGC 23.12's NCCL
    fabric = next(c for c in checks if c.name == "fabric")
    assert env == {"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_IB_GID_INDEX": "5"}
    assert "mlx5_0:1 → 5" in fabric.value and "fabric.gid_index: 5" in fabric.hint
    assert next(c for c in checks if c.name == "mlx5_0:1").value.endswith("RoCE v2 GID 5")
    env, checks = suggest_nccl(ports, [0], "2.21.5")
    assert env == {"NCCL_IB_HCA": "=mlx5_0:1"}
    assert "leave NCCL_IB_GID_INDEX unset" in next(c for c in checks if c.name == "fabric").hint
    assert "NCCL_IB_GID_INDEX" not in fabric_env(load_profile("example-roce"))  # never a forced 3
    assert fabric_env(load_profile("example-roce", ["fabric.gid_index=5"]))["NCCL_IB_GID_INDEX"] == "5"


def test_roce_ports_with_different_gid_tables_get_no_single_index(roce_ipv6_node):
    """Per-port advice, not the minimum over ports: one NCCL_IB_GID_INDEX cannot fit 5 and 3."""
    plain = [(LINK_LOCAL, "IB/RoCE v1"), (LINK_LOCAL, "RoCE v2"), (IPV4, "IB/RoCE v1"), (IPV4, "RoCE v2")]
    port(roce_ipv6_node, "mlx5_1", 1, "4: ACTIVE", "100 Gb/sec (2X HDR)", "Ethernet", plain, numa=0)
    rep = run(roce_ipv6_node, env={})  # torch here is a CPU build: NCCL version unknown
    assert rep.suggested_env == {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1"}
    fabric = next(c for c in rep.checks if c.name == "fabric")
    assert fabric.status == "warn" and "mlx5_0:1 → 5, mlx5_1:1 → 3" in fabric.value
    assert "GID tables differ" in fabric.hint
    env, checks = suggest_nccl(rep.ports, rep.gpu_numa, "2.23.4")
    assert "NCCL_IB_GID_INDEX" not in env and next(c for c in checks if c.name == "fabric").status == "ok"

"""doctor/env.py: the NCCL_*/GLOO_* a job will see, checked against the node's ports and interfaces."""

from __future__ import annotations

import json
import logging

from hpctrain.doctor.env import hca_check, interfaces, nccl_env_checks
from hpctrain.doctor.fabric import ib_ports
from hpctrain.doctor.gpus import gpu_numa_nodes
from hpctrain.site.fabric import fabric_env, hca_matches, set_gloo_ifname
from hpctrain.site.profile import load_profile
from tests.doctor.fake_sysfs import DGX_COMPUTE, netif, run_cli


def test_dgx_h100_bare_hca_name_is_a_prefix_of_other_rails(dgx_h100):
    """NCCL_IB_HCA=mlx5_1 also selects mlx5_10 and mlx5_11 (compute rails of other GPUs); the
    profile writes the exact form, which selects mlx5_1 alone."""
    ports, numa = ib_ports(dgx_h100), gpu_numa_nodes(dgx_h100)
    devices = {p.device for p in ports}
    assert hca_matches("mlx5_1", devices) == {"mlx5_1": ["mlx5_1", "mlx5_10", "mlx5_11"]}
    exported = fabric_env(load_profile("example-ib", ["fabric.hcas=[mlx5_1]"]))["NCCL_IB_HCA"]
    assert exported == "=mlx5_1:1" and hca_matches(exported, devices) == {"mlx5_1:1": ["mlx5_1"]}
    bare = hca_check("mlx5_1", ports, numa)
    assert bare.status == "warn" and "mlx5_1 also selects mlx5_10, mlx5_11; write =mlx5_1:1" in bare.hint
    assert "mlx5_1:1 (NUMA 2): no GPU on that NUMA node" in bare.hint
    exact = hca_check(exported, ports, numa)
    assert exact.status == "warn" and "prefix" not in exact.hint and "mlx5_1:1 (NUMA 2)" in exact.hint
    assert hca_check("=mlx5_0:2", ports, numa).status == "fail"  # no port 2 on mlx5_0


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
    assert {n: v["status"] for n, v in c.items()} == {
        "NCCL_SOCKET_IFNAME": "ok",
        "GLOO_SOCKET_IFNAME": "ok",
        "NCCL_IB_HCA": "ok",
    }


def test_ipoib_named_ibp24s0_not_ib0(dgx_h100, hpctrain_log):
    """IPoIB is ibp24s0 here: ib0 fails NCCL; the profile's NCCL pattern reaches NCCL only, and
    each task derives a plain gloo name from it on its own node."""
    ifaces = interfaces(dgx_h100)
    assert ifaces == ["docker0", "eno3", "ibp24s0", "ibp64s0", "lo"]

    def checks(env):
        return {c.name: c for c in nccl_env_checks(env, [], ifaces)}

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
    task = {"NCCL_SOCKET_IFNAME": "=ib0"}
    with hpctrain_log.at_level(logging.WARNING, logger="hpctrain"):
        assert set_gloo_ifname(task, dgx_h100) is None and "GLOO_SOCKET_IFNAME" not in task
    assert "GLOO_SOCKET_IFNAME left unset" in hpctrain_log.text and "NCCL_SOCKET_IFNAME==ib0" in hpctrain_log.text


def test_nccl_env_mistakes(ib_node, capsys, monkeypatch):
    for k, v in {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "enp", "NCCL_IB_HCA": "mlx5_7"}.items():
        monkeypatch.setenv(k, v)
    rc, out = run_cli(capsys, "doctor", "--sysfs-root", str(ib_node))
    assert rc == 1
    assert "WARN  NCCL_DEBUG" in out and "left on" in out
    assert "FAIL  NCCL_SOCKET_IFNAME" in out and "this node has: eth0, ib0, lo" in out
    assert "FAIL  NCCL_IB_HCA" in out and "mlx5_7 not on this node" in out
    ok = nccl_env_checks({"NCCL_SOCKET_IFNAME": "eth,ib"}, [], ["eth0", "lo"])
    assert [(c.name, c.status) for c in ok] == [("NCCL_SOCKET_IFNAME", "ok"), ("GLOO_SOCKET_IFNAME", "ok")]
    assert ok[1].value.startswith("eth0 ")
    excl = nccl_env_checks({"NCCL_SOCKET_IFNAME": "^docker,lo"}, [], ["lo"])
    assert [(c.name, c.value) for c in excl] == [("GLOO_SOCKET_IFNAME", "left unset")]  # never lo for gloo
    assert nccl_env_checks({"NCCL_SOCKET_IFNAME": "=eth"}, [], ["eth0"])[0].status == "fail"
    assert nccl_env_checks({"NCCL_SOCKET_IFNAME": "=eth0"}, [], ["eth0"])[0].status == "ok"

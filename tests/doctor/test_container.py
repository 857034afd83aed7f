"""doctor/container.py: what leaks into an image and whether RDMA is reachable from it."""

from __future__ import annotations

import sys

from hpctrain.doctor.container import container_checks, in_container
from hpctrain.doctor.fabric import ib_ports
from tests.doctor.fake_sysfs import write


def test_container_checks(tmp_path, ib_node):
    home = tmp_path / "home"
    site = home / ".local/lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (site / "numpy").mkdir(parents=True)
    ports = ib_ports(ib_node)
    env = {"HOME": str(home), "APPTAINER_CONTAINER": "/img.sif"}
    bare = tmp_path / "root"
    bare.mkdir()
    by_name = {c.name: c for c in container_checks(env, ports, inside=True, root=str(bare))}
    assert by_name["~/.local"].status == "warn" and "numpy" in by_name["~/.local"].value
    assert by_name["/dev/infiniband"].status == "warn"
    assert by_name["verbs provider"].status == "fail" and "falls back to TCP" in by_name["verbs provider"].hint
    node = tmp_path / "node"
    (node / "dev/infiniband").mkdir(parents=True)
    (node / "dev/infiniband/uverbs0").touch()
    write(node / "usr/lib/x86_64-linux-gnu/libibverbs/libmlx5-rdmav34.so", "")
    env["PYTHONNOUSERSITE"] = "1"
    by_name = {c.name: c for c in container_checks(env, ports, inside=True, root=str(node))}
    assert {n: c.status for n, c in by_name.items()} == {
        "~/.local": "ok",
        "/dev/infiniband": "ok",
        "verbs provider": "ok",
    }
    assert by_name["verbs provider"].value == "mlx5"
    assert in_container(env) and not in_container({})

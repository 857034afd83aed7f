"""GPUDirect RDMA on a node (site/gpudirect.py), in `hpctrain doctor` and `health.preflight`: a fake
sysfs/procfs tree of a DGX H100 whose HCAs can or cannot reach its GPUs' memory, the way NCCL finds
out (a peer-memory module's file under /sys; DMA-BUF from Linux 5.12 with the open GPU kernel module)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.doctor import report
from hpctrain.doctor.fabric import gpudirect_check, ib_ports
from hpctrain.doctor.gpus import gpu_numa_nodes
from hpctrain.site import gpudirect
from hpctrain.train.health.preflight import gpudirect_warnings
from tests.doctor.fake_sysfs import write  # its fixtures (dgx_h100, ib_node): tests/conftest.py

PROPRIETARY = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.90.07  Fri May 31 09:35:42 UTC 2024"
OPEN = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.90.07  Release Build  (dvs-builder@U16)"


def proc(tmp_path: Path, driver: str | None) -> Path:
    root = tmp_path / "proc"
    root.mkdir(exist_ok=True)
    if driver is not None:
        write(root / "driver" / "nvidia" / "version", f"{driver}\nGCC version:  gcc version 12.2.0\n")
    return root


def check(sys_root: Path, proc_root: Path, kernel: str, env: dict[str, str] | None = None):
    g = gpudirect.detect(sys_root, proc_root, kernel)
    return gpudirect_check(ib_ports(sys_root), len(gpu_numa_nodes(sys_root)), g, env)


def test_a_dgx_without_peermem_or_dma_buf_warns_with_the_fix(dgx_h100, tmp_path):
    c = check(dgx_h100, proc(tmp_path, PROPRIETARY), "5.15.0-91-generic")
    assert c.status == "warn" and "stage every inter-node transfer through host memory" in c.value
    assert "modprobe nvidia-peermem" in c.hint and "open GPU kernel module" in c.hint


def test_an_old_kernel_says_dma_buf_needs_5_12(dgx_h100, tmp_path):
    c = check(dgx_h100, proc(tmp_path, OPEN), "4.18.0-513.el8.x86_64")  # RHEL 8: no dma-buf registration
    assert c.status == "warn" and "DMA-BUF needs Linux >= 5.12, not 4.18.0-513.el8.x86_64" in c.hint


@pytest.mark.parametrize("module", gpudirect.PEERMEM)
def test_each_file_nccl_looks_for_means_a_peer_memory_module(dgx_h100, tmp_path, module):
    write(dgx_h100 / module, "1.3\n")
    c = check(dgx_h100, proc(tmp_path, PROPRIETARY), "5.15.0-91-generic")
    assert (c.status, c.value) == ("ok", "nvidia_peermem (a peer-memory module) is loaded")


def test_the_open_kernel_module_on_a_new_kernel_is_dma_buf_unless_nccl_is_told_not_to(dgx_h100, tmp_path):
    proc_root = proc(tmp_path, OPEN)
    c = check(dgx_h100, proc_root, "6.8.0-45-generic")
    assert c.status == "ok" and c.value.startswith("DMA-BUF (Linux 6.8.0-45-generic")
    off = check(dgx_h100, proc_root, "6.8.0-45-generic", {"NCCL_DMABUF_ENABLE": "0"})
    assert off.status == "warn" and "NCCL_DMABUF_ENABLE=0" in off.value


def test_a_node_without_gpus_or_hcas_has_no_such_check(ib_node, tmp_path):
    assert check(ib_node, proc(tmp_path, None), "6.1.0-18-amd64") is None  # HCAs, no NVIDIA GPU
    assert check(tmp_path / "empty", proc(tmp_path, None), "6.1.0-18-amd64") is None


def test_doctor_runs_the_check_on_the_node(dgx_h100, tmp_path):
    proc(tmp_path, PROPRIETARY)  # under the report's root: <root>/proc
    r = report.run(sysfs_root=dgx_h100, env={}, root=str(tmp_path))
    (c,) = [c for c in r.checks if c.name == "GPUDirect RDMA"]
    assert c.status == "warn" and "modprobe nvidia-peermem" in c.hint
    assert "GPUDirect RDMA" in report.format_report(r)


def test_preflight_warns_per_node_without_failing():
    lines = gpudirect_warnings(
        {"gpu02": ("", "load the peer-memory module"), "gpu01": ("nvidia_peermem", "x"), "gpu03": ("dma-buf", "x")}
    )
    assert lines == [
        "gpu02: no GPUDirect RDMA (NCCL stages every inter-node transfer through host memory): "
        "load the peer-memory module"
    ]

"""GPUDirect RDMA on this node: whether its InfiniBand/RoCE HCAs can read and write GPU memory directly.

Without it NCCL still runs, silently: every inter-node transfer is staged through host memory
(`NET/IB/0` in NCCL_DEBUG=INFO's lines instead of `NET/IB/0/GDRDMA`), a fraction of the fabric's
bandwidth. NCCL registers GPU memory with the HCA in one of two ways (src/transport/net_ib.cc, read
in NVIDIA/nccl): a peer-memory kernel module, found by one of `PEERMEM` existing under /sys
(`ibGdrSupportInitOnce`: nv_peer_mem, or nvidia_peermem, shipped with the driver since R470); or
DMA-BUF, which needs Linux >= 5.12 (the RDMA core's dma-buf memory registration) and a GPU driver
that exports its memory as dma-buf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED; NVIDIA's GPU Operator
docs: the open GPU kernel module), unless NCCL_DMABUF_ENABLE=0. Read from files only (no CUDA, no
torch): `hpctrain doctor` on a node and `health.preflight` in the task both ask (docs/sites.md).
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from pathlib import Path

# a peer-memory module, as NCCL looks for one (relative to /sys)
PEERMEM = (
    "kernel/mm/memory_peers/nv_mem/version",
    "kernel/mm/memory_peers/nv_mem_nc/version",
    "module/nvidia_peermem/version",
)
DMABUF_KERNEL = (5, 12)  # the RDMA core registers dma-buf memory from this release on
OPEN_MODULE = "Open Kernel Module"  # in /proc/driver/nvidia/version's first line for the open flavour


@dataclass(frozen=True)
class GpuDirect:
    """What this node offers NCCL for GPUDirect RDMA."""

    peermem: bool  # a peer-memory module is loaded
    kernel: str  # the kernel release (uname -r)
    driver: str  # the NVIDIA driver's version line ("" without a loaded driver)

    @property
    def dmabuf(self) -> bool:
        """A kernel and a driver that can register GPU memory as dma-buf."""
        return kernel_at_least(self.kernel, DMABUF_KERNEL) and OPEN_MODULE in self.driver

    @property
    def way(self) -> str:
        """How NCCL can reach GPU memory: nvidia_peermem, dma-buf, or "" (through host memory)."""
        return "nvidia_peermem" if self.peermem else "dma-buf" if self.dmabuf else ""

    def fix(self) -> str:
        """What an admin does where neither way is there."""
        dmabuf = (
            "or install the open GPU kernel module (DMA-BUF; this kernel has it)"
            if kernel_at_least(self.kernel, DMABUF_KERNEL)
            else f"(DMA-BUF needs Linux >= 5.12, not {self.kernel}, and the open GPU kernel module)"
        )
        return f"load the peer-memory module as root (`modprobe nvidia-peermem`, in the driver since R470) {dmabuf}"


def kernel_at_least(release: str, want: tuple[int, int]) -> bool:
    """`release` (uname -r: 6.1.0-18-amd64) is at least major.minor `want`; False when unreadable."""
    m = re.match(r"(\d+)\.(\d+)", release)
    return m is not None and (int(m[1]), int(m[2])) >= want


def detect(sysfs_root: str | Path = "/sys", proc_root: str | Path = "/proc", kernel: str | None = None) -> GpuDirect:
    """This node's GpuDirect (the roots and the kernel release for a test's fake node)."""
    try:
        driver = Path(proc_root, "driver/nvidia/version").read_text().splitlines()[0].strip()
    except (OSError, IndexError):
        driver = ""
    peermem = any(Path(sysfs_root, p).exists() for p in PEERMEM)
    return GpuDirect(peermem, platform.release() if kernel is None else kernel, driver)

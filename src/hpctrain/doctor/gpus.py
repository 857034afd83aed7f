"""Where the GPUs sit on the PCI bus (NUMA nodes), read from sysfs: no driver, torch or allocation needed."""

from __future__ import annotations

from pathlib import Path

from hpctrain.doctor.sysfs import pci_numa_node, read_or_empty


def gpu_numa_nodes(sysfs_root: str | Path = "/sys") -> list[int]:
    """NUMA node of each NVIDIA GPU on the PCI bus (vendor 0x10de, class 3D 0x0302xx or VGA
    0x0300xx; NVSwitches are bridges, 0x0680xx). Read from sysfs, so it works without torch,
    the driver or a GPU allocation (CUDA_VISIBLE_DEVICES) on the node."""
    nodes = []
    for dev in sorted(Path(sysfs_root, "bus/pci/devices").glob("*")):
        if read_or_empty(dev / "vendor").lower() != "0x10de":
            continue
        if read_or_empty(dev / "class").lower().startswith(("0x0302", "0x0300")):
            nodes.append(pci_numa_node(dev))
    return nodes

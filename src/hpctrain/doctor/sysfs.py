"""Reading sysfs without failing: a missing file is an empty answer, not an error (the same
code reads a DGX node, a VM, a container and a test's fake tree)."""

from __future__ import annotations

import re
from pathlib import Path


def read_or_empty(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def natural_key(name: str) -> list:
    """Sort key that puts mlx5_2 before mlx5_10."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", name)]


def pci_numa_node(pci_dir: Path) -> int:
    """A PCI device's NUMA node; -1 when the kernel does not say (one socket, or no ACPI SRAT)."""
    try:
        return int(read_or_empty(pci_dir / "numa_node") or -1)
    except ValueError:
        return -1

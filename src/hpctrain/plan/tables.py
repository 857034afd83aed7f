"""Public figures the planner falls back on when nothing was measured on the target machine.

No GPU measurement exists in this project yet (bench/gpu_accept.py has not been run), so every value
here is from a public source, named next to it (docs/plan.md has the details). Measured inputs
(`hpctrain bench --json`, `hpctrain doctor --allreduce --json`) replace them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuFigure:
    """A published training throughput: images/s per GPU for one ViT shape on one GPU model."""

    gpu: str  # matched as a case-insensitive substring of --gpu (first hit wins)
    model: str
    img_size: int
    patch_size: int
    depth: int
    width: int
    mlp_hidden: int
    per_gpu_batch: int
    images_per_s: float  # per GPU, data-parallel on one node
    source: str


ROSETTA = (
    "NVIDIA JAX-Toolbox rosetta/projects/vit README, 'Pre-training Performance Results', "
    "ViT-B/16 bf16, 8 GPUs x 512 images (JAX, no Transformer Engine)"
)
NEMO_VIT = (
    "NVIDIA NeMo Framework user guide, Vision Transformer > Performance, ViT g/14 on one "
    "DGX node (8 GPUs, 64 images per GPU, bf16 O2)"
)

GPU_FIGURES: list[GpuFigure] = [
    # 11669.52 samples/s on 8 x H100, 7200.38 on 8 x A100 80GB (ROSETTA)
    GpuFigure("H100", "ViT-B/16", 224, 16, 12, 768, 3072, 512, 11669.52 / 8, ROSETTA),
    GpuFigure("A100", "ViT-B/16", 224, 16, 12, 768, 3072, 512, 7200.38 / 8, ROSETTA),
    # 1,428 samples/s on 1 x 8 H100, 693 on 1 x 8 A100 80GB (NEMO_VIT); g/14: width 1408, FFN 6144,
    # 40 layers, patch 14 (NeMo's ViT model table)
    GpuFigure("H100", "ViT-g/14", 224, 14, 40, 1408, 6144, 64, 1428 / 8, NEMO_VIT),
    GpuFigure("A100", "ViT-g/14", 224, 14, 40, 1408, 6144, 64, 693 / 8, NEMO_VIT),
]


@dataclass(frozen=True)
class LinkFigure:
    """All-reduce bus bandwidth (nccl-tests' busbw, GB/s) of a link class, large messages."""

    busbw_gbps: float
    what: str
    source: str


# Inside a node: NVLink/NVSwitch, per GPU model.
NVLINK: dict[str, LinkFigure] = {
    "H100": LinkFigure(
        460.0,
        "8 x H100 SXM, NVLink 4 / NVSwitch",
        "alayanew tech blog 'NCCL-tests in practice' (2026-05-06): 8xH100 SXM5 "
        "all_reduce busbw 460-480 GB/s at large sizes; lower end taken",
    ),
    "A100": LinkFigure(
        230.0, "8 x A100 SXM, NVLink 3 / NVSwitch", "same source: 8xA100 SXM4 busbw 230-250 GB/s; lower end taken"
    ),
}

# Between nodes, per profile fabric.kind: the node's aggregate line rate, which is what a ring
# all-reduce's busbw approaches when each GPU has its own rail.
FABRICS: dict[str, LinkFigure] = {
    "ib": LinkFigure(
        400.0,
        "8 x 400 Gb/s NDR InfiniBand rails per node (DGX H100 layout)",
        "8 x 50 GB/s line rate; Saturn Cloud 'Validating multi-node GPU clusters with "
        "NCCL tests': H100 SXM + NDR expected busbw 400-450 GB/s; lower end taken",
    ),
    "roce": LinkFigure(
        200.0,
        "8 x 200 Gb/s RoCE ports per node",
        "8 x 25 GB/s line rate, assumed reached as on InfiniBand (not measured)",
    ),
    "socket": LinkFigure(
        3.0,
        "one 25 Gb/s Ethernet port, TCP sockets",
        "25 Gb/s = 3.1 GB/s line rate, rounded down (assumed, not measured)",
    ),
}

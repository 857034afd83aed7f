"""Model FLOPs from the ViT's shape, and MFU against a known (or given) accelerator peak.

Counted analytically (no tracing): matmuls and the patch convolution only, the convention of
MFU papers (PaLM appendix B). One multiply-add = 2 FLOPs; a trained image costs forward + backward
≈ 3 × forward. Activation checkpointing re-runs the forward, but MFU counts model FLOPs, not the
hardware's, so it does not change the figure. Imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.memory import param_count
from hpctrain.models.arch import arch_dims

# Dense bf16 matrix peak in TFLOP/s per device, the figure MFU is defined against (PaLM
# appendix B: the accelerator's theoretical peak), matched against torch.cuda.get_device_name()
# in order (first hit wins, so specific names come before their family). Datasheets quote the
# bf16 tensor-core rate with 2:4 sparsity; the dense rate is half of it (H100/H200 SXM: 1,979 ->
# 989.5; docs/observability.md, "Speed and memory").
PEAK_BF16_TFLOPS: list[tuple[str, float, str]] = [
    ("GH200", 989.0, "datasheet dense bf16"),
    ("H200", 989.0, "datasheet dense bf16 (SXM: 1,979 with sparsity)"),
    ("H100 PCIe", 756.0, "datasheet dense bf16"),
    ("H100 NVL", 835.0, "datasheet dense bf16"),
    ("H100", 989.0, "datasheet dense bf16 (SXM: 1,979 with sparsity)"),
    ("H800", 989.0, "datasheet dense bf16"),
    ("B200", 2250.0, "datasheet dense bf16"),
    ("A100", 312.0, "datasheet dense bf16"),
    ("A800", 312.0, "datasheet dense bf16"),
    ("L40S", 362.0, "datasheet dense bf16"),
    ("L40", 181.0, "datasheet dense bf16"),
    ("L4", 121.0, "datasheet dense bf16"),
    ("A10G", 70.0, "datasheet dense bf16"),
    ("A10", 125.0, "datasheet dense bf16"),
    ("RTX 4090", 165.0, "datasheet dense bf16 (fp32 accumulate: 82.6 on GeForce)"),
]

# What a large bf16 matmul reaches in practice where it was measured (DESIGN.md: ~790 TFLOP/s
# on an H200): a second, 'of achievable' figure next to MFU, never the MFU denominator.
ACHIEVABLE_BF16_TFLOPS: list[tuple[str, float]] = [
    ("H200", 790.0),
]


@dataclass(frozen=True)
class VitFlops:
    """Per-image counts of one ViT configuration."""

    fwd_macs: float  # multiply-adds of one forward pass

    @property
    def fwd_flops(self) -> float:
        return 2.0 * self.fwd_macs

    @property
    def train_flops(self) -> float:
        """Forward + backward (≈ 2 × forward) of one trained image."""
        return 3.0 * self.fwd_flops


def vit_macs(img_size: int, patch_size: int, depth: int, width: int, mlp_ratio: float,
             num_classes: int, class_token: bool = True, rep_size: int = 0) -> float:
    """Forward multiply-adds of one image through a ViT (patch conv, blocks, head)."""
    grid = img_size // patch_size
    patches = grid * grid
    n = patches + (1 if class_token else 0)
    hidden = int(width * mlp_ratio)
    embed = patches * width * 3 * patch_size * patch_size
    qkv = n * width * 3 * width
    attn = 2 * n * n * width  # q·kᵀ and attn·v over all heads
    proj = n * width * width
    mlp = 2 * n * width * hidden
    head = (rep_size or width) * num_classes + width * rep_size  # + the pre-logits Dense
    return float(embed + depth * (qkv + attn + proj + mlp) + head)


def model_params(mc) -> int:
    """Trainable parameters of a `ModelConfig` (what DDP all-reduces; no torch needed): a fixed
    sin-cos position embedding has no gradient, so it is left out."""
    return param_count(mc).trainable


def model_flops(mc) -> VitFlops:
    """FLOPs of a `ModelConfig` (no torch needed)."""
    depth, width, _ = arch_dims(mc)
    return VitFlops(vit_macs(mc.img_size, mc.patch_size, depth, width, mc.mlp_ratio, mc.num_classes,
                             class_token=mc.has_class_token, rep_size=mc.rep_size))


def peak_tflops(device_name: str | None) -> tuple[float | None, str]:
    """(dense bf16 spec peak TFLOP/s, where the figure comes from) for a device name; None when
    unknown (then `--peak-tflops` / `train.peak_tflops`)."""
    if not device_name:
        return None, "unknown device: pass --peak-tflops (train.peak_tflops in training)"
    for key, tflops, source in PEAK_BF16_TFLOPS:
        if key.lower() in device_name.lower():
            return tflops, f"{key}: {source}"
    return None, f"{device_name!r} is not in the table: pass --peak-tflops (train.peak_tflops in training)"


def achievable_tflops(device_name: str | None) -> float | None:
    """The measured large-matmul bf16 rate of a device (ACHIEVABLE_BF16_TFLOPS), None when unknown."""
    for key, tflops in ACHIEVABLE_BF16_TFLOPS:
        if device_name and key.lower() in device_name.lower():
            return tflops
    return None


def mfu(images_per_s: float, train_flops_per_image: float, peak_tflops_per_device: float | None,
        devices: int = 1) -> float | None:
    """Model FLOPs utilisation: achieved model FLOP/s over the devices' peak (0-1); None without
    a peak. Pass the spec peak for MFU proper, an achievable rate for 'of achievable'."""
    if not peak_tflops_per_device or peak_tflops_per_device <= 0:
        return None
    return images_per_s * train_flops_per_image / (peak_tflops_per_device * 1e12 * devices)

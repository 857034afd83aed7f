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


@dataclass(frozen=True)
class Peak:
    """One product's dense bf16 tensor-core peak and where the figure comes from."""

    product: str  # the product as its datasheet names it
    tflops: float  # dense (no 2:4 sparsity) bf16 TFLOP/s per device
    source: str  # the datasheet line the figure is read from
    names: tuple[str, ...]  # what torch.cuda.get_device_name() (CUDA's device name) reports for it


# Dense bf16 matrix peak per device, the figure MFU is defined against (PaLM appendix B: the
# accelerator's theoretical peak), keyed by the exact device names CUDA reports (docs/observability.md,
# "MFU: the definition and the peaks"). NVIDIA's datasheets quote bf16 with 2:4 sparsity; the dense
# rate is half of it. Form factors of one chip differ in clocks and power, hence in peak: the H200 NVL
# (a 600 W PCIe card) is not the 700 W H200 SXM.
_H100 = "nvidia.com/en-us/data-center/h100 datasheet"
_H200 = "nvidia.com/en-us/data-center/h200 datasheet"
_A100 = "nvidia.com/en-us/data-center/a100 datasheet"


def _half(product: str, sparse: str, url: str) -> str:
    return f"dense = half of BF16 Tensor Core {product} {sparse} TFLOPS with sparsity ({url})"


PEAKS: tuple[Peak, ...] = (
    Peak("H100 SXM", 989.0, _half("H100 SXM", "1,979", _H100), ("NVIDIA H100 80GB HBM3",)),
    Peak("H100 PCIe", 756.0, _half("H100 PCIe", "1,513", _H100), ("NVIDIA H100 PCIe",)),
    Peak("H100 NVL", 835.0, _half("H100 NVL", "1,671", _H100), ("NVIDIA H100 NVL",)),
    Peak("H200 SXM", 989.0, _half("H200 SXM", "1,979", _H200), ("NVIDIA H200",)),
    Peak("H200 NVL", 835.0, _half("H200 NVL", "1,671", _H200), ("NVIDIA H200 NVL",)),
    Peak("A100 SXM", 312.0, _half("A100", "624", _A100), ("NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB")),
    Peak("A100 PCIe", 312.0, _half("A100", "624", _A100), ("NVIDIA A100 80GB PCIe", "NVIDIA A100-PCIE-40GB")),
)

# A device name not in PEAKS (a new memory size, an OEM variant, another product) falls back to the
# first family whose key it contains, most specific first, and its source says so: check the figure
# against the product's datasheet, or pass log.peak_tflops / --peak-tflops.
FAMILY_BF16_TFLOPS: list[tuple[str, float, str]] = [
    ("GH200", 989.0, "datasheet dense bf16 (1,979 with sparsity)"),
    ("H200 NVL", 835.0, "datasheet dense bf16 (1,671 with sparsity)"),
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
PEAK_BF16_TFLOPS = FAMILY_BF16_TFLOPS  # the name docs and callers knew: the fallback table

# What a large bf16 matmul reaches in practice where it was measured (docs/observability.md, MFU:
# ~790 TFLOP/s on an H200 SXM): a second, 'of achievable' figure next to MFU, never the MFU denominator. By
# exact device name: another form factor (the H200 NVL) was not measured.
ACHIEVABLE_BF16_TFLOPS: list[tuple[str, float]] = [
    ("NVIDIA H200", 790.0),
]


def _norm(name: str) -> str:
    return " ".join(name.lower().split())


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


def vit_macs(
    img_size: int,
    patch_size: int,
    depth: int,
    width: int,
    mlp_ratio: float,
    num_classes: int,
    class_token: bool = True,
    rep_size: int = 0,
) -> float:
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
    return VitFlops(
        vit_macs(
            mc.img_size,
            mc.patch_size,
            depth,
            width,
            mc.mlp_ratio,
            mc.num_classes,
            class_token=mc.has_class_token,
            rep_size=mc.rep_size,
        )
    )


def peak_tflops(device_name: str | None) -> tuple[float | None, str]:
    """(dense bf16 spec peak TFLOP/s, where the figure comes from) for a device name: the product
    whose exact name it is (PEAKS), else the most specific family it contains (FAMILY_BF16_TFLOPS);
    None when unknown (then `--peak-tflops` / `log.peak_tflops`)."""
    if not device_name:
        return None, "unknown device: pass --peak-tflops (log.peak_tflops in training)"
    name = _norm(device_name)
    for p in PEAKS:
        if name in (_norm(n) for n in p.names):
            return p.tflops, f"{p.product}: {p.source}"
    for key, tflops, source in FAMILY_BF16_TFLOPS:
        if key.lower() in name:
            return tflops, (
                f"{key} family: {source}; {device_name!r} is not an exact name in the table: "
                "check its datasheet or pass --peak-tflops (log.peak_tflops)"
            )
    return None, f"{device_name!r} is not in the table: pass --peak-tflops (log.peak_tflops in training)"


def achievable_tflops(device_name: str | None) -> float | None:
    """The measured large-matmul bf16 rate of a device (ACHIEVABLE_BF16_TFLOPS, by exact name), None
    when it was not measured."""
    for key, tflops in ACHIEVABLE_BF16_TFLOPS:
        if device_name and _norm(key) == _norm(device_name):
            return tflops
    return None


def mfu(
    images_per_s: float, train_flops_per_image: float, peak_tflops_per_device: float | None, devices: int = 1
) -> float | None:
    """Model FLOPs utilisation: achieved model FLOP/s over the devices' peak (0-1); None without
    a peak. Pass the spec peak for MFU proper, an achievable rate for 'of achievable'."""
    if not peak_tflops_per_device or peak_tflops_per_device <= 0:
        return None
    return images_per_s * train_flops_per_image / (peak_tflops_per_device * 1e12 * devices)

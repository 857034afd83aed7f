"""ViT sizes by name, without torch: login-node code (memory estimate, FLOPs, planning) needs the
shape of the model, not the model."""

from __future__ import annotations

# depth, width, heads
ARCHS = {
    "vit_tiny": (12, 192, 3),
    "vit_small": (12, 384, 6),
    "vit_base": (12, 768, 12),
    "vit_large": (24, 1024, 16),
    "vit_huge": (32, 1280, 16),
}


def arch_dims(mc) -> tuple[int, int, int]:
    """(depth, width, heads) of a ModelConfig: arch defaults, overridden field by field."""
    depth, width, heads = ARCHS[mc.arch]
    return mc.depth or depth, mc.width or width, mc.heads or heads

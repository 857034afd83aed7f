"""GPU fast-path switches (TF32, SDPA backend) and the check of which attention kernel runs.

Each switch is a config field (train.tf32, train.sdpa_backend); on CPU they change nothing, so
CPU tests and GPU runs compute the same thing up to the precision the switch states.
"""

from __future__ import annotations

import logging

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hpctrain.train import compat

log = logging.getLogger("hpctrain")

# aten op → backend name: the op scaled_dot_product_attention dispatches to for the given inputs
SDPA_OPS = {
    "_scaled_dot_product_flash_attention_for_cpu": "flash (cpu)",
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_scaled_dot_product_fused_attention_overrideable": "fused (backend-specific)",
    "_scaled_dot_product_attention_math": "math",
}


def apply(train_cfg, device: torch.device) -> None:
    """Set the process-wide backend flags a config asks for (CUDA only)."""
    if device.type != "cuda":
        return
    torch.backends.cuda.matmul.allow_tf32 = train_cfg.tf32
    torch.backends.cudnn.allow_tf32 = train_cfg.tf32
    if train_cfg.sdpa_backend != "auto":
        compat.set_sdpa_backend(train_cfg.sdpa_backend)


def sdpa_backend_used(model: torch.nn.Module, images: torch.Tensor, autocast) -> str:
    """Which SDPA kernel one forward of `model` dispatches to ("none" when it calls no SDPA).

    Runs one eager forward (with grad, eval mode: no drop-path draws) and records the aten ops
    that reach the dispatcher, so what is reported is what PyTorch chose for these shapes and
    dtypes, not what was asked for.
    """
    seen: set[str] = set()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    was = model.training
    model.eval()
    try:
        with torch.enable_grad(), autocast, Record():
            model(images[:2])
    finally:
        model.train(was)
    found = [name for op, name in SDPA_OPS.items() if op in seen]
    if images.device.type == "cpu":  # torch 2.2 names CPU flash attention like the CUDA kernel
        found = ["flash (cpu)" if name == "flash" else name for name in found]
    return ", ".join(found) if found else "none"

"""GPU fast-path switches (TF32, SDPA backend) and the check of which attention kernel runs.

Each switch is a config field (train.tf32, train.sdpa_backend); on CPU they change nothing, so
CPU tests and GPU runs compute the same thing up to the precision the switch states.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
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
    that reach the dispatcher inside each `F.scaled_dot_product_attention` call, so what is
    reported is what PyTorch chose for these shapes and dtypes, not what was asked for. The math
    kernel never reaches the dispatcher under its own name (`_scaled_dot_product_attention_math`
    is CompositeImplicitAutograd: only its bmm/softmax decomposition does), so an SDPA call that
    dispatches to no fused kernel is math; an unknown fused op is named as it is.
    """
    calls: list[set[str]] = []  # the aten ops each SDPA call dispatched, one set per call

    class Calls(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is F.scaled_dot_product_attention:
                calls.append(set())
            return func(*args, **(kwargs or {}))

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if calls:
                calls[-1].add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    was = model.training
    model.eval()
    try:
        with torch.enable_grad(), autocast, Calls(), Record():
            model(images[:2])
    finally:
        model.train(was)
    found: list[str] = []
    for ops in calls:  # in call order, each kernel once
        name = kernel_name(ops, images.device.type)
        if name not in found:
            found.append(name)
    return ", ".join(found) if found else "none"


def kernel_name(ops: set[str], device_type: str) -> str:
    """The SDPA kernel one call ran, from the aten ops it dispatched (see sdpa_backend_used)."""
    named = [name for op, name in SDPA_OPS.items() if op in ops]
    if not named:
        fused = sorted(op for op in ops if op.startswith("_scaled_dot_product_") and "backward" not in op)
        named = fused or ["math"]
    if device_type == "cpu":  # torch 2.2 names CPU flash attention like the CUDA kernel
        named = ["flash (cpu)" if name == "flash" else name for name in named]
    return ", ".join(named)

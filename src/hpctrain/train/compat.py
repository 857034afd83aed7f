"""The PyTorch APIs that differ between the versions hpctrain supports (2.2 to the newest).

The default image, NGC pytorch:23.12-py3, has PyTorch 2.2 (and installs hpctrain with --no-deps,
so pip never checks the floor there); the rest of the code is written against the newest torch.
Everything that moved or appeared in between is chosen here, by what the running torch has, so
the callers read alike on every version and the gaps fail with one line naming the torch needed.

| what | 2.2 | newer |
| --- | --- | --- |
| fp16 loss scaling | `torch.cuda.amp.GradScaler` (CUDA only) | `torch.amp.GradScaler(device)` (2.3+, CPU too) |
| SDPA kernel switch | flash, efficient, math | + cuDNN (`enable_cudnn_sdp`, 2.3+) |
| CPU flash attention op | `_scaled_dot_product_flash_attention` | `..._for_cpu` (2.3+) |
| FSDP2 `fully_shard` | absent | `torch.distributed._composable.fsdp` (2.4-2.5), `torch.distributed.fsdp` (2.6+) |
| FSDP2 `MixedPrecisionPolicy` | absent | next to `fully_shard`, same modules |
| FSDP2 on the CPU (gloo) | absent | refused on 2.4-2.5 (CUDA streams only); runs on 2.13 |
| sharded / async checkpoints | refused (one file, rank 0) | DCP `state_dict` API + `async_save` (2.4+) |
| gradient norm, no clipping | `torch._foreach_norm` (as `clip_grad_norm_`) | `nn.utils.get_total_norm` (2.6+) |
| DCP `save`/`async_save`/`load` alone | no `no_dist` keyword (2.4, 2.5: a TypeError) | `no_dist=` (2.13) |

DCP's `no_dist` keyword is never passed: every torch from 2.4 infers it, true when no process group
is initialised (`no_dist = no_dist or not dist.is_initialized()` in 2.13's state_dict_saver and
_loader; 2.5.1 infers it the same way and has no keyword, read in its wheel).

FSDP2 on the CPU: 2.5.1's `FSDPCommContext.lazy_init` (`torch.distributed._composable.fsdp`) raises
"FSDP requires CUDA for streams" at the first forward without CUDA (read in its wheel; measured by
the pytorch-cuda stack pass; 2.4's is reported the same, pytorch/pytorch#132471). 2.6 moved FSDP2 to
`torch.distributed.fsdp`; CPU runs are tested on 2.13 (the main pass), 2.6-2.12 are not tested here.
"""

from __future__ import annotations

import re

import torch

from hpctrain.config import ConfigError

MIN_TORCH = (2, 2)  # pyproject.toml's floor: the NGC 23.12 image's torch, tested by .ci/stack on its recipe
FSDP_MIN_TORCH = (2, 4)  # FSDP2 fully_shard and StateDictOptions(broadcast_from_rank0=...)
FSDP_CPU_MIN_TORCH = (2, 6)  # FSDP2 without CUDA (2.4, 2.5: "FSDP requires CUDA for streams")
CPU_FUSED_ADAM_MIN_TORCH = (2, 4)  # torch._fused_adamw_ on the CPU backend (2.2, 2.3: CUDA only)
SHARDED_MIN_TORCH = (2, 4)  # DCP's get/set_*_state_dict by parameter name and dcp.async_save (docs/checkpoints.md)


def version_tuple(version: str | None = None) -> tuple[int, int]:
    """(major, minor) of `version` (default: the running torch): '2.2.0a0+81ea7a4' → (2, 2)."""
    m = re.match(r"(\d+)\.(\d+)", version or torch.__version__)
    if not m:
        raise ValueError(f"cannot read a torch version from {version!r}")
    return int(m.group(1)), int(m.group(2))


def cpu_fused_adam(version: str | None = None) -> bool:
    """Whether this torch has the fused Adam kernel on the CPU (AdamWLowMu/Lamb take it there)."""
    return version_tuple(version) >= CPU_FUSED_ADAM_MIN_TORCH


def check_parallel(parallel: str, version: str | None = None) -> None:
    """Refuse dist.parallel=fsdp on a torch without FSDP2, before any process group or file.

    Checked whatever the world size (one process ignores the setting): a config that cannot run
    on the image's torch should fail in the one-process trial, not on the 16-node job.
    """
    version = version or torch.__version__
    if parallel == "fsdp" and version_tuple(version) < FSDP_MIN_TORCH:
        need = ".".join(map(str, FSDP_MIN_TORCH))
        raise ConfigError(
            f"dist.parallel=fsdp needs torch >= {need}; this is {version}: use "
            "dist.parallel=ddp (or an image with a newer PyTorch)"
        )


def fully_shard():
    """FSDP2's `fully_shard` from where this torch has it (ConfigError below 2.4)."""
    check_parallel("fsdp")
    try:
        from torch.distributed.fsdp import fully_shard  # 2.6+
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard  # 2.4, 2.5
    return fully_shard


def fsdp_mixed_precision():
    """FSDP2's `MixedPrecisionPolicy`, from where this torch has `fully_shard` (ConfigError below 2.4)."""
    check_parallel("fsdp")
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy  # 2.6+
    except ImportError:
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy  # 2.4, 2.5
    return MixedPrecisionPolicy


def ckpt_format(ckpt_cfg, world_size: int, version: str | None = None) -> str:
    """The checkpoint format a run writes: `ckpt.format`, with auto resolved (sharded for
    several ranks or async saves where this torch has DCP's API for it, else one file); a sharded
    or async request that this torch cannot run is refused in one line."""
    version = version or torch.__version__
    fmt, background = ckpt_cfg.format, ckpt_cfg.async_save
    new_enough = version_tuple(version) >= SHARDED_MIN_TORCH
    if fmt == "auto":
        fmt = "sharded" if new_enough and (world_size > 1 or background) else "single"
    if (fmt == "sharded" or background) and not new_enough:
        need = ".".join(map(str, SHARDED_MIN_TORCH))
        what = "ckpt.async_save=true" if background else "ckpt.format=sharded"
        raise ConfigError(
            f"{what} needs torch >= {need} (torch.distributed.checkpoint's state_dict API and "
            f"async_save); this is {version}: use ckpt.format=single and "
            "ckpt.async_save=false (or an image with a newer PyTorch)"
        )
    if background and fmt == "single":
        raise ConfigError(
            "ckpt.async_save=true writes sharded checkpoints: set ckpt.format=sharded "
            "(or auto), or ckpt.async_save=false"
        )
    return fmt


def check_fsdp_device(parallel: str, device: torch.device, version: str | None = None) -> None:
    """Refuse dist.parallel=fsdp on the CPU where FSDP2 needs CUDA (torch 2.4, 2.5)."""
    version = version or torch.__version__
    if parallel == "fsdp" and device.type == "cpu" and version_tuple(version) < FSDP_CPU_MIN_TORCH:
        need = ".".join(map(str, FSDP_CPU_MIN_TORCH))
        raise ConfigError(
            f"dist.parallel=fsdp on the CPU needs torch >= {need} (2.4 and 2.5's FSDP2 needs CUDA "
            f"streams); this is {version}: use dist.parallel=ddp on the CPU, or GPUs"
        )


def check_train(cfg, device: torch.device) -> None:
    """Every setting this torch cannot run on `device`, refused in one line: called by
    every rank before the rendezvous, so no rank waits for another and nothing is written."""
    check_parallel(cfg.dist.parallel)
    check_fsdp_device(cfg.dist.parallel, device)
    ckpt_format(cfg.ckpt, 1)
    if cfg.train.amp == "fp16" and device.type != "cuda" and not hasattr(torch.amp, "GradScaler"):
        raise _fp16_error(device)
    nccl = nccl_version() if device.type == "cuda" else None
    if cfg.dist.grad_reduce_dtype == "bf16" and nccl is not None and nccl < (2, 10):
        raise ConfigError(
            f"dist.grad_reduce_dtype=bf16 needs NCCL >= 2.10 (bf16 all-reduce); this torch "
            f"has NCCL {'.'.join(map(str, nccl))}: use dist.grad_reduce_dtype=fp32"
        )
    if (
        cfg.train.sdpa_backend == "cudnn"
        and device.type == "cuda"
        and not hasattr(torch.backends.cuda, "enable_cudnn_sdp")
    ):
        raise _cudnn_sdpa_error()


def nccl_version() -> tuple[int, ...] | None:
    """NCCL's (major, minor, patch) in this torch; None when it has none (CPU builds)."""
    try:
        v = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return tuple(v) if isinstance(v, tuple) else None


def grad_scaler(device: torch.device, sharded: bool = False):
    """The fp16 loss scaler for `device`; `sharded` (FSDP): one whose skip is every rank's.

    torch 2.3+ has one class for every device, CPU included. 2.2 has only the CUDA one, while its
    CPU autocast does compute in fp16: an fp16 CPU run there would train unscaled (gradients
    underflow silently), so it is refused in one line instead.

    Under FSDP each rank holds a shard of every gradient, so an inf is seen by the rank whose shard
    holds it. `ShardedGradScaler` (`torch.distributed.fsdp.sharded_grad_scaler`, `unscale_`)
    all-reduces found_inf over the group before the step: every rank skips, every scale halves
    alike. A plain GradScaler agrees only through DTensor's dispatcher (`found_inf_reduce_handler`
    in `torch.distributed.tensor._dispatch`: 2.5.1 and 2.13 have it, read in their wheels); on a
    torch without it the rank with the inf skips and halves its scale while the others step (issue
    58, tests/train/test_fsdp.py). Both reductions on 2.5+: one 4-byte all-reduce more per step.
    """
    if sharded:
        # FSDP runs only (FSDP needs torch >= 2.4, whose ShardedGradScaler takes the device first)
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device.type)
    if hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler(device.type)
    if device.type != "cuda":
        raise _fp16_error(device)
    return torch.cuda.amp.GradScaler()


def _fp16_error(device: torch.device) -> ConfigError:
    return ConfigError(
        f"train.amp=fp16 on {device.type} needs torch >= 2.3 (its loss scaler); this is "
        f"{torch.__version__}: use train.amp=bf16 or none"
    )


def _cudnn_sdpa_error() -> ConfigError:
    return ConfigError(
        f"train.sdpa_backend=cudnn needs torch >= 2.3; this is {torch.__version__}: use "
        "train.sdpa_backend=flash or auto"
    )


def set_sdpa_backend(want: str, backends=None) -> None:
    """Allow only the SDPA kernel `want` (flash, cudnn, efficient, math), process-wide.

    The global `enable_*_sdp` switches exist in every supported torch (unlike the context
    managers, which moved from `torch.backends.cuda.sdp_kernel` to `torch.nn.attention.sdpa_kernel`
    in 2.3); cuDNN attention has a switch from 2.3 on. `backends` is torch.backends.cuda (tests
    pass a stand-in).
    """
    backends = backends or torch.backends.cuda
    has_cudnn = hasattr(backends, "enable_cudnn_sdp")
    if want == "cudnn" and not has_cudnn:
        raise _cudnn_sdpa_error()
    backends.enable_flash_sdp(want == "flash")
    backends.enable_mem_efficient_sdp(want == "efficient")
    backends.enable_math_sdp(want == "math")
    if has_cudnn:
        backends.enable_cudnn_sdp(want == "cudnn")


def grad_total_norm(params) -> torch.Tensor:
    """The total 2-norm of the gradients of `params`, as `clip_grad_norm_` computes it, without
    clipping: the gradients are only read. A device scalar, no host sync; under FSDP2 (DTensor
    gradients, each rank a shard) the full norm, through an all-reduce on the device."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    get_total_norm = getattr(torch.nn.utils, "get_total_norm", None)  # 2.6+: clip_grad_norm_'s own first half
    if get_total_norm is not None:
        norm = get_total_norm(grads, 2.0, False, None)
    else:  # 2.2-2.5: clip_grad_norm_'s foreach path, per device and dtype
        groups: dict = {}
        for g in grads:
            groups.setdefault((g.device, g.dtype), []).append(g)
        norms = [n for group in groups.values() for n in torch._foreach_norm(group, 2.0)]
        norm = torch.linalg.vector_norm(torch.stack([n.to(grads[0].device) for n in norms]), 2.0)
    return full_norm(norm)


def full_norm(norm: torch.Tensor) -> torch.Tensor:
    """A norm over FSDP2's sharded gradients is a DTensor (a partial sum per rank): its full value,
    an all-reduce on the device; a plain tensor as it is."""
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

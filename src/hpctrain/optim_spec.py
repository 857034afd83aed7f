"""The optimizers hpctrain knows, one `OptimSpec` each: what `optim.name` may be (the config's choices),
what the config refuses with it (FSDP, a fused kernel, a bf16 first moment, fp16's GradScaler), the
state it keeps per parameter (memory.py's estimate and the checkpoint size) and the function that
builds it (train/optim/build.py). Adding an optimizer is one entry here and its builder; an optimizer
without an entry is refused when the config loads, never estimated as another.

torch-free (the login node's config rules and memory plan read it): a builder is named by its
"module:function" path, imported by train/optim/build.py in the task.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hpctrain.errors import UserError


@dataclass(frozen=True)
class OptimSpec:
    """One optimizer: how it is built and what the config and the memory plan must know of it."""

    name: str  # the optim.name that chooses it
    title: str  # its name in messages ("AdamW")
    builder: str  # "module:function" of build(cfg, param_groups, device) -> torch.optim.Optimizer
    state_bytes: Callable[[Any], int]  # optimizer-state bytes per trainable parameter, from an OptimConfig
    fsdp_refusal: str = ""  # why it cannot run under dist.parallel=fsdp and the fix ("" = it can)
    fused: bool = False  # has a fused kernel (optim.fused=always allowed)
    bf16_mu: bool = False  # can keep its first moment in bf16 (optim.mu_dtype=bf16 allowed)
    grad_scaler: bool = True  # steps under fp16's GradScaler (train.amp=fp16 allowed)


def _adam_bytes(o: Any) -> int:
    return (2 if o.mu_dtype == "bf16" else 4) + 4  # first moment (fp32 or bf16), second moment fp32


BUILD = "hpctrain.train.optim.build"

# name -> spec; config.OptimConfig.name's choices are this dict's live keys (in this order)
OPTIMIZERS: dict[str, OptimSpec] = {
    s.name: s
    for s in (
        OptimSpec("adamw", "AdamW", f"{BUILD}:build_adamw", _adam_bytes, fused=True, bf16_mu=True),
        OptimSpec(
            "lamb",
            "LAMB",
            f"{BUILD}:build_lamb",
            lambda o: 8,  # two fp32 moments
            fsdp_refusal="takes each tensor's norm whole, which FSDP shards; use dist.parallel=ddp with LAMB "
            "(or optim.name=adamw with FSDP)",
        ),
        OptimSpec("sgd", "SGD", f"{BUILD}:build_sgd", lambda o: 4 if o.momentum > 0 else 0),  # momentum buffer
    )
}


def spec(name: str) -> OptimSpec:
    """The spec of optimizer `name`; an unknown name is refused with the known ones."""
    try:
        return OPTIMIZERS[name]
    except KeyError:
        raise UserError(
            f"optim.name={name!r} is not an optimizer hpctrain knows: use one of {', '.join(OPTIMIZERS)}"
        ) from None

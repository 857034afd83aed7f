"""AdamW or LAMB with the usual no-decay groups, and the per-step warm-up + cosine schedule."""

from __future__ import annotations

import math

import torch

from hpctrain.config import Config, ConfigError


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices only: norms, biases, position embedding and class token are not decayed."""
    skip = getattr(model, "no_weight_decay", lambda: set())()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name in skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(cfg: Config, model: torch.nn.Module, device: torch.device) -> torch.optim.Optimizer:
    o = cfg.optim
    if o.name == "lamb":
        if cfg.train.parallel == "fsdp":
            raise ConfigError("optim.name=lamb takes each tensor's norm whole, which FSDP shards; use "
                              "train.parallel=ddp with LAMB (or optim.name=adamw with FSDP)")
        from hpctrain.train.lamb import Lamb

        return Lamb(param_groups(model, o.weight_decay), lr=cfg.peak_lr, betas=tuple(o.betas), eps=o.eps,
                    always_adapt=o.lamb_adapt == "all")
    if o.mu_dtype == "bf16":
        from hpctrain.train.adamw import AdamWLowMu

        return AdamWLowMu(param_groups(model, o.weight_decay), lr=cfg.peak_lr, betas=tuple(o.betas), eps=o.eps,
                          mu_dtype=torch.bfloat16)
    fused = o.fused == "always" or (o.fused == "auto" and device.type == "cuda")
    return torch.optim.AdamW(param_groups(model, o.weight_decay), lr=cfg.peak_lr, betas=tuple(o.betas),
                             eps=o.eps, fused=fused or None)


def warmup_steps(cfg: Config, steps_per_epoch: int) -> int:
    return cfg.optim.warmup_steps or int(round(cfg.optim.warmup_epochs * steps_per_epoch))


def lr_at(step: int, peak: float, warmup: int, total: int, min_lr: float, schedule: str) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warm-up, then cosine to min_lr."""
    if warmup and step < warmup:
        return peak * (step + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return peak
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (peak - min_lr) * (1 + math.cos(math.pi * t))

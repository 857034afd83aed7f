"""AdamW, LAMB or SGD (optim_spec.OPTIMIZERS names their builders here) with the usual no-decay groups (and
layer-wise lr decay); the warm-up + cosine schedule."""

from __future__ import annotations

import importlib
import math

import torch

from hpctrain.config import Config, ConfigError
from hpctrain.optim_spec import spec
from hpctrain.train.optim.adamw import AdamWLowMu
from hpctrain.train.optim.lamb import Lamb


def layer_id(name: str, depth: int) -> int:
    """MAE's get_layer_id_for_vit (after BEiT): embeddings and class token 0, block i → i + 1,
    everything after the blocks (final norm, pre-logits, head) depth + 1."""
    if name in ("cls_token", "pos_embed") or name.startswith("patch_embed"):
        return 0
    if name.startswith("blocks."):
        return int(name.split(".")[1]) + 1
    return depth + 1


def param_groups(
    model: torch.nn.Module, weight_decay: float, layer_decay: float = 1.0, head_lr_mult: float = 1.0
) -> list[dict]:
    """Decay matrices only: norms, biases, position embedding and class token are not decayed.

    With layer_decay < 1 or head_lr_mult != 1, one group per (layer, decay, head) with an `lr_scale`
    the schedule's lr is multiplied by (MAE's param_groups_lrd: scale = layer_decay^(depth + 1 -
    layer_id)); without them, the two groups as always (and no lr_scale), so older runs' optimizer
    states keep their layout."""
    skip = getattr(model, "no_weight_decay", lambda: set())()
    if layer_decay == 1.0 and head_lr_mult == 1.0:
        decay, no_decay = [], []
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            (no_decay if p.ndim <= 1 or name in skip else decay).append(p)
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    depth = len(model.blocks)
    groups: dict[tuple, dict] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        wd = 0.0 if p.ndim <= 1 or name in skip else weight_decay
        lid = layer_id(name, depth)
        head = name.startswith("head.")
        scale = layer_decay ** (depth + 1 - lid) * (head_lr_mult if head else 1.0)
        g = groups.setdefault((lid, head, wd), {"params": [], "weight_decay": wd, "lr_scale": scale})
        g["params"].append(p)
    return list(groups.values())


def build_optimizer(cfg: Config, model: torch.nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """The optimizer optim.name names, built by its OptimSpec's builder over the parameter groups (what the
    config refuses with it, e.g. LAMB under FSDP, was refused when the config loaded)."""
    o = cfg.optim
    module, _, func = spec(o.name).builder.partition(":")
    build = getattr(importlib.import_module(module), func)
    return build(cfg, param_groups(model, o.weight_decay, o.layer_decay, o.head_lr_mult), device)


def build_sgd(cfg: Config, groups: list[dict], device: torch.device) -> torch.optim.Optimizer:
    return torch.optim.SGD(groups, lr=cfg.peak_lr, momentum=cfg.optim.momentum)


def build_lamb(cfg: Config, groups: list[dict], device: torch.device) -> torch.optim.Optimizer:
    o = cfg.optim
    return Lamb(groups, lr=cfg.peak_lr, betas=tuple(o.betas), eps=o.eps, always_adapt=o.lamb_adapt == "all")


def build_adamw(cfg: Config, groups: list[dict], device: torch.device) -> torch.optim.Optimizer:
    """torch's AdamW (fused on CUDA with optim.fused=auto), or hpctrain's own with a bf16 first moment."""
    o = cfg.optim
    if o.mu_dtype == "bf16":
        return AdamWLowMu(groups, lr=cfg.peak_lr, betas=tuple(o.betas), eps=o.eps, mu_dtype=torch.bfloat16)
    fused = o.fused == "always" or (o.fused == "auto" and device.type == "cuda")
    return torch.optim.AdamW(groups, lr=cfg.peak_lr, betas=tuple(o.betas), eps=o.eps, fused=fused or None)


def warmup_steps(cfg: Config, steps_per_epoch: int) -> int:
    return cfg.optim.warmup_steps or int(round(cfg.optim.warmup_epochs * steps_per_epoch))


def lr_at(
    step: int,
    peak: float,
    warmup: int,
    total: int,
    min_lr: float,
    schedule: str,
    *,
    warmup_lr: float = 0.0,
    cooldown: int = 0,
    per_epoch: int = 0,
) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warm-up from `warmup_lr`, then cosine
    to min_lr, reached `cooldown` steps before `total` and held there.

    per_epoch = steps per epoch: the rate changes once per epoch, as DeiT's main.py drives timm's
    CosineLRScheduler (t_in_epochs; `lr_scheduler.step(epoch)` after epoch e sets timm's lr(e) for
    epoch e+1, so epoch e trains at lr(e-1), and epochs 0 and 1 both at warmup_lr). There the cosine
    is timm's: over the epochs before the cool-down, counted from epoch 0 (warm-up not subtracted).
    """
    if per_epoch:
        t = max(step // per_epoch - 1, 0)
        w, end = warmup / per_epoch, (total - cooldown) / per_epoch
        if t < w:
            return warmup_lr + t * (peak - warmup_lr) / w
        if schedule == "constant":
            return peak
        return min_lr + 0.5 * (peak - min_lr) * (1 + math.cos(math.pi * t / end)) if t < end else min_lr
    if warmup and step < warmup:
        return warmup_lr + (peak - warmup_lr) * (step + 1) / warmup
    end = total - cooldown
    if schedule == "constant" or end <= warmup:
        return peak if schedule == "constant" or step < end else min_lr
    t = min(1.0, (step - warmup) / max(1, end - warmup))
    return min_lr + 0.5 * (peak - min_lr) * (1 + math.cos(math.pi * t))


def lr_schedule(cfg: Config, steps_per_epoch: int, total: int):
    """step → learning rate for this run (optim.* schedule keys)."""
    o = cfg.optim
    warmup, cooldown = warmup_steps(cfg, steps_per_epoch), int(round(o.cooldown_epochs * steps_per_epoch))
    if cooldown >= total:
        raise ConfigError(
            f"optim.cooldown_epochs={o.cooldown_epochs:g} leaves no step of the {total} for the "
            "cosine; lower it below the training length (train.epochs / train.max_steps)"
        )
    per_epoch = steps_per_epoch if o.lr_update == "epoch" else 0
    peak = cfg.peak_lr

    def lr(step: int) -> float:
        return lr_at(
            step,
            peak,
            warmup,
            total,
            o.min_lr,
            o.schedule,
            warmup_lr=o.warmup_lr,
            cooldown=cooldown,
            per_epoch=per_epoch,
        )

    return lr

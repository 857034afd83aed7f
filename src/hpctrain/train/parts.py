"""What a Trainer trains with, built from the config before it: the model in its wrappers (FSDP
shards in place, torch.compile, DDP), the optimizer, the fp16 GradScaler, the EMA, the mix-up/CutMix
mixer (`TrainParts`), and the step plan that the loader's length and the config give (`StepPlan`).

torchtitan builds its model parts and optimizers the same way, then hands them to the trainer;
here `train.loop.build_trainer` does it, so a Trainer is given what it trains, not a recipe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as td

from hpctrain.config import Config
from hpctrain.train import comm, compat, fastpath, fsdp
from hpctrain.train.ckpt.resume_checks import planned_steps
from hpctrain.train.dist import DistInfo
from hpctrain.train.mixup import Mixer
from hpctrain.train.optim.build import build_optimizer, lr_schedule, warmup_steps
from hpctrain.train.optim.ema import EMA


@dataclass
class TrainParts:
    """The model and what updates it, on the device."""

    model: torch.nn.Module  # the weights a checkpoint holds (sharded in place under FSDP)
    fwd_model: torch.nn.Module  # what a step calls: the model, compiled, inside DDP when wrapped
    ddp: torch.nn.parallel.DistributedDataParallel | None  # the DDP wrapper (more than one rank, dist.parallel=ddp)
    reduce_hook: comm.CountingHook | None  # DDP's gradient hook, which counts the bytes reduced
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None  # train.amp=fp16's loss scaler
    ema: EMA | None  # train.ema > 0
    mixer: Mixer  # mix-up / CutMix and label smoothing of each micro-batch
    fsdp: bool  # dist.parallel=fsdp (on one rank too)
    step_amp: str  # the autocast a step runs under: none for bf16 under FSDP, whose policy casts


def build_parts(cfg: Config, dist: DistInfo, device: torch.device, model: torch.nn.Module) -> TrainParts:
    """`model` moved to `device` and wrapped as the config says, with its optimizer, scaler, EMA and
    mixer. The fast-path switches (TF32, SDPA backend) are set first: compile reads them."""
    t = cfg.train
    model = model.to(device)
    fastpath.apply(t, device)
    is_fsdp = cfg.dist.parallel == "fsdp"  # on one rank too: a one-GPU FSDP run (or benchmark) runs FSDP
    if is_fsdp and not td.is_initialized():
        raise RuntimeError(
            "dist.parallel=fsdp shards over a process group, a world of 1 too: "
            "call train.collective.init(..., group_of_one=True) before the Trainer"
        )
    if is_fsdp:  # train.ema is refused with fsdp when the config loads (TrainConfig.validate)
        fsdp.shard(model, device, cfg.dist.fsdp_reshard, t.amp, cfg.dist.grad_reduce_dtype)
    optimizer = build_optimizer(cfg, model, device)
    scaler = compat.grad_scaler(device, sharded=is_fsdp) if t.amp == "fp16" else None  # FSDP: found_inf agreed
    ema = EMA(model, t.ema) if t.ema > 0 else None  # before DDP, as ever
    a = cfg.aug
    mixer = Mixer(cfg.model.num_classes, a.label_smoothing, a.mixup, a.cutmix, a.mix_prob, a.switch_prob, t.seed)
    fwd_model: torch.nn.Module = model
    if cfg.compile.enabled:
        fwd_model = torch.compile(model, mode=None if cfg.compile.mode == "default" else cfg.compile.mode)
    ddp, reduce_hook = None, None
    if dist.world_size > 1 and cfg.dist.parallel == "ddp":
        ddp, reduce_hook = comm.wrap(fwd_model, device, cfg)
        fwd_model = ddp
    return TrainParts(
        model=model,
        fwd_model=fwd_model,
        ddp=ddp,
        reduce_hook=reduce_hook,
        optimizer=optimizer,
        scaler=scaler,
        ema=ema,
        mixer=mixer,
        fsdp=is_fsdp,
        # bf16 under FSDP is FSDP's mixed-precision policy (train.fsdp), so no autocast in steps
        step_amp="none" if is_fsdp and t.amp == "bf16" else t.amp,
    )


@dataclass(frozen=True)
class StepPlan:
    """The run's length in optimizer steps and its learning-rate schedule."""

    accum: int  # micro-batches per optimizer step (train.accum_steps)
    steps_per_epoch: int  # optimizer steps per pass over the train loader
    total_steps: int  # the run's last step (train.epochs or train.max_steps)
    warmup: int  # the schedule's warm-up steps
    lr_of: Callable[[int], float]  # the learning rate of a step, before any group's lr_scale

    @classmethod
    def of(cls, cfg: Config, train_batches: int) -> StepPlan:
        """From the config and the train loader's batches per epoch; a loader shorter than one step
        is refused with the settings to change."""
        accum = cfg.train.accum_steps
        per_epoch = train_batches // accum
        if per_epoch == 0:
            raise ValueError(
                "the train loader has fewer batches than train.accum_steps: lower data.global_batch or "
                "train.accum_steps"
            )
        total = planned_steps(cfg, train_batches)
        return cls(accum, per_epoch, total, warmup_steps(cfg, per_epoch), lr_schedule(cfg, per_epoch, total))

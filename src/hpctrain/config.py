"""Typed, validated run configuration: YAML → frozen dataclasses.

Configs are data: every key is declared here with a type, a one-line doc and its bounds, so a
typo or a wrong value fails before anything runs (or is submitted), with the fix in the message.
This module imports nothing heavy: login nodes load configs without torch.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import json
import math
import re
import shlex
import sys
import types
import typing
import unicodedata
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hpctrain import shipped
from hpctrain.config_moves import MoveError, migrate_data, migrate_override
from hpctrain.errors import UserError
from hpctrain.models.arch import arch_dims
from hpctrain.optim_spec import OPTIMIZERS
from hpctrain.randaug_spec import parse_randaugment

CONFIG_DIR = shipped.CONFIG_DIR
TRACKERS = ("tensorboard", "mlflow", "wandb")  # log.trackers: what hpctrain.train.observe.trackers can feed


class ConfigError(UserError, ValueError):
    """A config problem, phrased for the person who wrote the config."""


def opt(
    default: Any,
    doc: str,
    *,
    choices: Collection[Any] | None = None,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    more: bool = False,
) -> Any:
    """A config field: default, one-line doc, allowed choices and numeric bounds. `more`: the key has
    a longer explanation under its own heading in docs/configs.md ("Keys in full")."""
    meta = {"doc": doc, "choices": choices, "lo": lo, "hi": hi, "lo_open": lo_open, "more": more}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


# --------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class ModelConfig:
    arch: str = opt(
        "vit_base",
        "ViT size; depth/width/heads below override it",
        choices=("vit_tiny", "vit_small", "vit_base", "vit_large", "vit_huge"),
    )
    patch_size: int = opt(16, "patch side in pixels", lo=1)
    img_size: int = opt(224, "input side in pixels (training crop)", lo=1)
    depth: int | None = opt(None, "transformer blocks (None: from arch)", lo=1)
    width: int | None = opt(None, "embedding dimension (None: from arch)", lo=1)
    heads: int | None = opt(None, "attention heads (None: from arch)", lo=1)
    mlp_ratio: float = opt(4.0, "MLP hidden size / width", lo=0, lo_open=True)
    pool: str = opt("token", "classifier input: class token or global average pool", choices=("token", "avg"))
    pos_embed: str = opt(
        "learn",
        "position embedding: learned or fixed 2-D sin-cos (MoCo v3's frequencies, or big_vision's: i/(D/4-1))",
        choices=("learn", "sincos", "sincos_big_vision"),
    )
    drop_path: float = opt(0.0, "stochastic depth rate of the last block", lo=0, hi=1)
    drop_rate: float = opt(
        0.0,
        "dropout after the position embedding, the attention output and the MLP layers",
        more=True,
        lo=0,
        hi=1,
    )
    attn_drop_rate: float = opt(
        0.0,
        "dropout on the attention probabilities, training only (timm attn_drop_rate, vit_jax attention_dropout_rate)",
        lo=0,
        hi=1,
    )
    num_classes: int = opt(1000, "classifier outputs", lo=1)
    grad_ckpt: bool = opt(False, "activation checkpointing of every block (saves memory)")
    rep_size: int = opt(
        0,
        "pre-logits Dense(rep_size) + tanh before the head, as big_vision's rep_size (true there = width); 0: off",
        lo=0,
    )
    head_init: str = opt(
        "zero",
        "classifier init: zero weight and bias (big_vision head_zeroinit) or trunc_normal std 0.02 (timm's default)",
        choices=("zero", "trunc_normal"),
    )
    init: str = opt(
        "timm",
        "weight init: timm (trunc-normal 0.02), deit (timm 0.3.2) or big_vision (Xavier, LeCun)",
        more=True,
        choices=("timm", "deit", "big_vision"),
    )
    gelu: str = opt(
        "auto",
        "MLP GELU: exact (erf) or tanh approximation; auto: tanh with model.init=big_vision",
        more=True,
        choices=("auto", "exact", "tanh"),
    )
    class_token: bool | None = opt(
        None,
        "a class token in the sequence (timm class_token); null: only with pool=token",
        more=True,
    )
    final_norm: str = opt(
        "auto",
        "final LayerNorm on the tokens or the pooled features (timm fc_norm); auto: pooled for avg",
        more=True,
        choices=("auto", "tokens", "pooled"),
    )
    init_from: str = opt(
        "",
        "start from these weights (not on resume): a timm-named state_dict, checkpoint or run",
        more=True,
    )
    init_ema: bool = opt(False, "model.init_from is a checkpoint with EMA weights: start from those")

    # keys that say where the first weights come from, not what the model is: a resume ignores them
    START_KEYS = ("init_from", "init_ema")

    @property
    def has_class_token(self) -> bool:
        return self.pool == "token" if self.class_token is None else self.class_token

    @property
    def has_fc_norm(self) -> bool:
        """The final norm on the pooled features (timm fc_norm), not on the tokens before the pool."""
        return self.final_norm == "pooled" or (self.final_norm == "auto" and self.pool == "avg")

    def validate(self) -> None:
        for key in ("drop_rate", "attn_drop_rate"):
            if getattr(self, key) >= 1:
                raise ConfigError(
                    f"model.{key}=1 drops every activation: use a rate below 1 (the ViT paper: "
                    "model.drop_rate=0.1), or 0 for none"
                )
        if self.pool == "token" and self.class_token is False:
            raise ConfigError(
                "model.pool=token reads the class token: set model.class_token=true (or null), or model.pool=avg"
            )
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://|^(hf[-_]hub|timm):|^timm/", self.init_from):
            raise ConfigError(
                f"model.init_from={self.init_from!r}: hpctrain reads no network at run time; download "
                "the weights first (e.g. a timm model's model.safetensors) and give the file's path"
            )


@dataclass(frozen=True)
class DataConfig:
    root: str = opt("", "dataset folder: root/train/<class>/*, root/val/<class>/* (or shards)")
    prepare: str = opt(
        "none",
        "digits: write the demo set into a missing data/digits; other missing roots are errors",
        more=True,
        choices=("none", "digits"),
    )
    loader: str = opt(
        "auto", "auto = DALI when importable, else torch (PIL)", choices=("auto", "dali", "torch", "synthetic")
    )
    format: str = opt(
        "folder", "folder = ImageNet layout; wds = WebDataset shards from `data pack`", choices=("folder", "wds")
    )
    global_batch: int = opt(1024, "global batch per optimizer step (all ranks, all micro-steps)", lo=1)
    eval_batch_per_rank: int = opt(0, "eval batch of each rank (0: the per-rank train batch)", lo=0)
    workers: int | str = opt(
        "auto",
        "loader processes (DALI: threads) per rank; auto: the task's CPUs less one, at most 8",
        more=True,
        lo=0,
    )
    crop_pct: float = opt(
        0.875, "val: resize shorter side to img_size / crop_pct, centre crop", lo=0, hi=1, lo_open=True
    )
    eval_resize: str = opt(
        "crop",
        "val: crop = short side resized, then centre crop (timm); squash = whole image (vit_jax)",
        more=True,
        choices=("crop", "squash"),
    )
    scale_min: float = opt(0.08, "random-resized-crop minimum area fraction", lo=0, hi=1, lo_open=True)
    crop: str = opt(
        "timm",
        "train crop sampler: timm RandomResizedCrop, or tf_inception (big_vision, vit_jax)",
        more=True,
        choices=("timm", "tf_inception"),
    )
    antialias: bool = opt(
        True,
        "train crop resize antialiases a downscale; false = plain resize (big_vision, vit_jax)",
        more=True,
    )
    interpolation: str = opt(
        "bilinear", "resize filter, train crop and val resize (DeiT: bicubic)", choices=("bilinear", "bicubic")
    )
    mean: tuple[float, ...] = opt((0.485, 0.456, 0.406), "per-channel mean (0-1 scale)")
    std: tuple[float, ...] = opt((0.229, 0.224, 0.225), "per-channel std (0-1 scale)")
    exclude_file: str = opt("", "file listing images to skip (from `prepare-imagenet --exclude-bad`)")
    on_bad_sample: str = opt(
        "stop",
        "an image that vanished or went bad mid-run: stop naming it, or skip and count it (torch loader)",
        choices=("stop", "skip"),
    )
    stage_to: str = opt(
        "",
        "copy the shards (data.format=wds) to this node-local path first, e.g. $TMPDIR",
        more=True,
    )
    stage_keep_days: int = opt(
        7,
        "at a staging, remove the user's copies on that node not staged for this many days (0: all not in use)",
        lo=0,
    )
    stage_remove_at_end: bool = opt(
        False, "remove the staged copy as the job's last task on the node that reads it exits (every attempt)"
    )
    synthetic_size: int = opt(1281, "images per epoch for the synthetic loader", lo=1)
    eval_splits: tuple[str, ...] = opt(
        ("val",),
        "eval splits: val (root/val), minival (1 % of root/train); the first is the headline",
        more=True,
    )

    EVAL_SPLITS = ("val", "minival")

    def validate(self) -> None:
        if isinstance(self.workers, str) and self.workers != "auto":
            raise ConfigError(
                f"data.workers={self.workers!r} is not allowed: use a number of loader workers per rank "
                "(0: load in the rank's own process) or auto (from the task's CPUs)"
            )
        for s in self.eval_splits:
            if s not in self.EVAL_SPLITS:
                raise ConfigError(
                    f"data.eval_splits: {s!r} is not a split; use val (root/val) or minival (1 % of "
                    "root/train held out), e.g. data.eval_splits=[val,minival]"
                )
        if len(set(self.eval_splits)) != len(self.eval_splits):
            raise ConfigError(f"data.eval_splits={list(self.eval_splits)} names a split twice: list each once")
        if not self.eval_splits:
            raise ConfigError("data.eval_splits is empty: name at least one split, e.g. data.eval_splits=[val]")
        if self.format == "wds" and self.loader == "torch":  # refused here, not by every rank of a job
            raise ConfigError(
                "data.format=wds needs data.loader=dali (the torch loader reads folders): set "
                "data.loader=dali, or data.format=folder with data.root an image folder"
            )


@dataclass(frozen=True)
class OptimConfig:
    name: str = opt(
        "adamw",
        "optimizer: AdamW, LAMB (8k-32k global batches) or SGD with momentum (fine-tuning)",
        more=True,
        choices=OPTIMIZERS.keys(),  # live: an OptimSpec added to the registry is a choice at once
    )
    lr: float = opt(5e-4, "peak learning rate at lr_ref_batch (before batch scaling)", lo=0, lo_open=True)
    lr_ref_batch: int = opt(0, "global batch that optim.lr is tuned for (0: lr is used as is)", lo=0)
    lr_scaling: str = opt(
        "linear",
        "how lr follows data.global_batch / lr_ref_batch: linear (AdamW, Goyal et al.), sqrt (LAMB, You et al.), none",
        choices=("linear", "sqrt", "none"),
    )
    weight_decay: float = opt(
        0.05,
        "weight decay, not on norms/biases/tokens (AdamW: decoupled, lr·wd; LAMB: inside the trust-ratio update)",
        lo=0,
    )
    betas: tuple[float, ...] = opt((0.9, 0.999), "Adam/LAMB betas")
    momentum: float = opt(0.9, "SGD momentum (optim.name=sgd)", lo=0, hi=1)
    layer_decay: float = opt(
        1.0,
        "layer-wise lr decay (BEiT/MAE): block i's lr x decay^(depth-i); 1 = off",
        more=True,
        lo=0,
        hi=1,
        lo_open=True,
    )
    head_lr_mult: float = opt(
        1.0, "learning-rate multiplier of the classifier head (head.*), on top of layer_decay", lo=0, lo_open=True
    )
    eps: float = opt(1e-8, "Adam/LAMB epsilon", lo=0, lo_open=True)
    warmup_epochs: float = opt(0.0, "linear warm-up length in epochs", lo=0)
    warmup_steps: int = opt(0, "linear warm-up length in steps (overrides warmup_epochs)", lo=0)
    min_lr: float = opt(1e-6, "cosine floor", lo=0)
    warmup_lr: float = opt(0.0, "learning rate the linear warm-up starts from (timm warmup_lr_init; DeiT: 1e-6)", lo=0)
    cooldown_epochs: float = opt(
        0.0, "last epochs of train.epochs held at min_lr after the cosine ends (timm cooldown_epochs)", lo=0
    )
    lr_update: str = opt(
        "step",
        "set the learning rate every optimizer step, or once per epoch as DeiT's main.py",
        more=True,
        choices=("step", "epoch"),
    )
    schedule: str = opt("cosine", "learning-rate schedule after warm-up", choices=("cosine", "constant"))
    clip_grad: float = opt(0.0, "clip the global gradient norm to this (0: off)", lo=0)
    lamb_adapt: str = opt(
        "all",
        "LAMB trust ratio on every tensor (the paper) or only on those with weight decay (apex/timm default)",
        choices=("all", "decayed"),
    )
    fused: str = opt(
        "auto", "fused AdamW: auto = on CUDA (LAMB has no fused kernel here)", choices=("auto", "always", "never")
    )
    mu_dtype: str = opt(
        "fp32",
        "dtype of Adam's first moment: bf16 as big_vision (hpctrain's own AdamW, not fused)",
        more=True,
        choices=("fp32", "bf16"),
    )

    def validate(self) -> None:
        if self.lr_scaling == "sqrt" and not self.lr_ref_batch:
            raise ConfigError(
                "optim.lr_scaling=sqrt needs optim.lr_ref_batch (the global batch optim.lr was "
                "tuned for), e.g. optim.lr_ref_batch=4096"
            )
        spec = OPTIMIZERS.get(self.name)
        if spec and self.fused == "always" and not spec.fused:
            have = " or ".join(s.title for s in OPTIMIZERS.values() if s.fused)
            raise ConfigError(
                f"optim.fused=always is for {have}: {self.name} has no fused kernel here; use optim.fused=auto"
            )
        if spec and self.mu_dtype == "bf16" and not spec.bf16_mu:
            have = " or ".join(f"optim.name={s.name}" for s in OPTIMIZERS.values() if s.bf16_mu)
            raise ConfigError(
                f"optim.mu_dtype=bf16 is for {have}; {self.name} keeps its moments in fp32: use optim.mu_dtype=fp32"
            )
        if self.mu_dtype == "bf16" and self.fused == "always":
            raise ConfigError(
                "optim.mu_dtype=bf16 runs hpctrain's own AdamW (torch's keeps Adam's moments in "
                "the parameter dtype), which has no fused kernel; use optim.fused=auto"
            )


STEP_WINDOW_RE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def step_window(text: str, key: str) -> tuple[int, int] | None:
    """`"A-B"` → (A, B), global optimizer steps 1 <= A <= B, inclusive; "" → None (off)."""
    if not str(text).strip():
        return None
    m = STEP_WINDOW_RE.match(str(text))
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ConfigError(
            f"{key}={text!r} is not a step window: use A-B with 1 <= A <= B (global steps, "
            "inclusive), e.g. 20-25, or leave it empty to turn it off"
        )
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = opt(300, "training epochs", lo=1)
    max_steps: int = opt(0, "stop after this many optimizer steps (0: epochs decide)", lo=0)
    accum_steps: int = opt(1, "micro-batches per optimizer step (gradient accumulation)", lo=1)
    amp: str = opt(
        "bf16", "mixed precision: bf16 autocast, fp16 + GradScaler, or none", choices=("none", "bf16", "fp16")
    )
    seed: int = opt(0, "seed of everything random", lo=0)
    ema: float = opt(0.0, "EMA decay of the weights (0: off)", lo=0, hi=1)
    eval_every_epochs: int = opt(1, "epochs between evaluations (0: only at the end)", lo=0)
    device: str = opt("auto", "auto = cuda when available", choices=("auto", "cuda", "cpu"))
    threads: int = opt(0, "torch intra-op threads per rank (0: leave as is)", lo=0)
    tf32: bool = opt(True, "TF32 matmuls/convolutions for the fp32 parts on Ampere+ GPUs (~1e-3 rel.)")
    sdpa_backend: str = opt(
        "auto",
        "attention kernel: auto = PyTorch picks (flash/cuDNN on GPUs)",
        choices=("auto", "flash", "cudnn", "efficient", "math"),
    )


@dataclass(frozen=True)
class CompileConfig:
    enabled: bool = opt(False, "torch.compile the model")
    mode: str = opt(
        "default",
        "torch.compile mode",
        choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
    )
    cache: str = opt(
        "",
        "Inductor and Triton caches saved here, one archive: a requeued or resumed job starts warm",
        more=True,
    )
    warmup: bool = opt(
        True,
        "under DDP: compile before the first collective, then wait for every rank",
        more=True,
    )
    timeout_s: int = opt(
        1800,
        "compile.warmup: how long ranks wait for the slowest rank's first compile",
        more=True,
        lo=1,
    )


@dataclass(frozen=True)
class AugConfig:
    hflip: float = opt(0.5, "probability of a horizontal flip", lo=0, hi=1)
    randaugment: str = opt(
        "",
        "RandAugment 'N,M' (timm's 0-10 scale) or a timm string, e.g. 'rand-m9-mstd0.5-inc1'",
        more=True,
    )
    erase_prob: float = opt(
        0.0,
        "random erasing: probability per training sample, after normalisation (timm RandomErasing; DeiT: 0.25)",
        lo=0,
        hi=1,
    )
    erase_mode: str = opt(
        "pixel",
        "random erasing fill: pixel (per-pixel noise), rand (a colour per channel), const (0)",
        more=True,
        choices=("pixel", "rand", "const"),
    )
    erase_count: int = opt(1, "random erasing: at most this many boxes per sample (area split between them)", lo=1)
    repeated_aug: int = opt(
        0,
        "repeated augmentation (DeiT RASampler): each sample this many times; 0 or 1 = off",
        more=True,
        lo=0,
    )
    mixup: float = opt(0.0, "mixup alpha (0: off)", lo=0)
    cutmix: float = opt(0.0, "cutmix alpha (0: off)", lo=0)
    mix_prob: float = opt(1.0, "probability of mixing a batch", lo=0, hi=1)
    switch_prob: float = opt(0.5, "probability of cutmix when both are on", lo=0, hi=1)
    label_smoothing: float = opt(0.1, "label smoothing", lo=0, hi=1)

    def validate(self) -> None:
        try:
            parse_randaugment(self.randaugment)
        except ValueError as e:
            raise ConfigError(str(e)) from None


@dataclass(frozen=True)
class CkptConfig:
    every: int | str = opt(
        500,
        "optimizer steps between checkpoints (0: only at the end), or auto (Young/Daly)",
        more=True,
        lo=0,
    )
    auto_first: int = opt(
        100,
        "ckpt.every=auto: steps to the first checkpoint, whose save time sets the interval",
        more=True,
        lo=1,
    )
    mtbf_h: float = opt(
        0.0,
        "ckpt.every=auto: the job's mean time between interruptions, hours (0: resolved)",
        more=True,
        lo=0,
    )
    keep: int = opt(3, "checkpoints kept (newest)", lo=1)
    keep_best: bool = opt(
        False, "also keep the checkpoint of the best eval top-1 (saved at that eval) beside the newest ckpt.keep"
    )
    on_error: str = opt(
        "stop", "a checkpoint that cannot be written: stop or warn and go on", choices=("stop", "continue")
    )
    format: str = opt(
        "auto",
        "checkpoint format: sharded (DCP, a part per rank), single (one file), auto",
        more=True,
        choices=("auto", "sharded", "single"),
    )
    async_save: bool = opt(
        False,
        "write sharded checkpoints in the background while training goes on (torch >= 2.4)",
        more=True,
    )

    def validate(self) -> None:
        if isinstance(self.every, str) and self.every != "auto":
            raise ConfigError(
                f"ckpt.every={self.every!r} is not allowed: use a number of optimizer steps "
                "(0: only at the end) or auto (from the measured save time, docs/checkpoints.md)"
            )


@dataclass(frozen=True)
class DistConfig:
    parallel: str = opt("ddp", "data parallelism: ddp, or fsdp for models that do not fit", choices=("ddp", "fsdp"))
    pg_timeout_s: int = opt(600, "process-group timeout: a dead or stuck rank fails the job after this", lo=1)
    stop_every: int = opt(
        0,
        "steps between stop agreements (0: from the plan's step time at submission, else 1)",
        more=True,
        lo=0,
    )
    ddp_bucket_mb: int = opt(25, "DDP gradient bucket size in MB", lo=1)
    ddp_bucket_view: bool = opt(True, "DDP gradient_as_bucket_view (grads alias the buckets: no copy)")
    ddp_static_graph: str = opt(
        "auto",
        "DDP static_graph: auto = on unless train.accum_steps > 1 or compile.enabled (docs/communication.md)",
        choices=("auto", "always", "never"),
    )
    fsdp_reshard: bool = opt(True, "FSDP: free gathered weights after forward (less memory, more comms)")
    grad_reduce_dtype: str = opt(
        "fp32",
        "dtype gradients are all-reduced in (DDP comm hook; FSDP reduce_dtype): bf16 halves the bytes",
        choices=("fp32", "bf16"),
    )


@dataclass(frozen=True)
class HealthConfig:
    hang_timeout_s: int | None = opt(
        None,
        "no step for this long: every rank dumps its stacks, the job fails (null: pg/2)",
        more=True,
        lo=0,
    )
    on_nonfinite: str = opt(
        "rollback",
        "non-finite loss or grad norm (or a spike): roll back to the last good checkpoint, or stop",
        more=True,
        choices=("rollback", "stop"),
    )
    max_rollbacks: int = opt(
        3, "rollbacks per run (counted in its checkpoints) before it stops with a non-zero exit", lo=0
    )
    rollback_skip_batches: int = opt(
        0,
        "global batches skipped after a rollback (0: those since the checkpoint)",
        more=True,
        lo=0,
    )
    spike_factor: float = opt(
        0.0,
        "a logged loss above this x the median of the last spike_window is a spike; 0: off",
        more=True,
        lo=0,
    )
    spike_window: int = opt(20, "logged losses the spike median runs over (at least 3 must be logged first)", lo=3)
    straggler_frac: float = opt(
        0.15,
        "name a rank whose time per step exceeds the median's by more than this fraction of a step",
        more=True,
        lo=0,
    )
    exclude_straggler_frac: float = opt(
        0.0,
        "slower by this fraction of a step 3 intervals in a row: stop, go on without its node",
        more=True,
        lo=0,
    )
    preflight: bool = opt(
        False,
        "before training, at every start: time matmuls, all-reduces, a decode; name bad nodes",
        more=True,
    )
    preflight_min_frac: float = opt(
        0.5,
        "preflight on GPU: fail below this fraction of the GPU's peak or the fabric's busbw",
        more=True,
        lo=0,
        hi=1,
        lo_open=True,
    )
    preflight_tolerance: float = opt(
        0.3,
        "preflight without a reference figure: fail this fraction below the median",
        more=True,
        lo=0,
        hi=1,
        lo_open=True,
    )
    preflight_busbw_gbps: float = opt(
        0.0,
        "preflight: a node pair's expected all-reduce busbw, GB/s (0: the fabric's)",
        more=True,
        lo=0,
    )

    def validate(self) -> None:
        if 0 < self.spike_factor <= 1:
            raise ConfigError(
                f"health.spike_factor={self.spike_factor:g} would flag every loss at or above its "
                "median as a spike: use a factor > 1 (e.g. 2.0), or 0 to turn spike detection off"
            )


@dataclass(frozen=True)
class LogConfig:
    every: int = opt(10, "optimizer steps between metric lines", lo=1)
    peak_tflops: float = opt(
        0.0,
        "dense bf16 peak TFLOP/s per device for MFU (0: from the table of known GPUs)",
        more=True,
        lo=0,
    )
    trackers: tuple[str, ...] = opt(
        ("tensorboard",),
        "where rank 0 also sends the metrics: tensorboard, mlflow, wandb",
        more=True,
    )
    mlflow_uri: str = opt("", "MLflow tracking URI (empty: the file store <run>/mlruns)")
    mlflow_experiment: str = opt("hpctrain", "MLflow experiment the run goes in")
    wandb_project: str = opt("hpctrain", "W&B project")
    wandb_mode: str = opt(
        "offline",
        "W&B mode: offline (compute nodes have no network; hpctrain sync RUN uploads from the login node) or online",
        choices=("offline", "online"),
    )
    profile_steps: str = opt(
        "",
        "torch.profiler window A-B (global steps, e.g. 20-25) to <run>/profile/; empty: off",
        more=True,
    )
    profile_ranks: tuple[int, ...] = opt(
        (),
        "ranks that profile (and dump memory snapshots), e.g. [0, 7]; empty: 0 and the last",
        more=True,
    )
    profile_with_stack: bool = opt(False, "log.profile_steps: record Python stacks too (larger traces, slower)")
    memory_snapshot_steps: str = opt(
        "",
        "CUDA only: allocator history over steps A-B, dumped to <run>/profile/",
        more=True,
    )

    def validate(self) -> None:
        bad = [n for n in self.trackers if n not in TRACKERS]
        if bad:
            raise ConfigError(f"log.trackers: unknown tracker {bad[0]!r}; allowed: {', '.join(TRACKERS)}")
        for key in ("profile_steps", "memory_snapshot_steps"):
            step_window(getattr(self, key), f"log.{key}")
        if any(r < 0 for r in self.profile_ranks):
            raise ConfigError(
                f"log.profile_ranks={self.profile_ranks!r}: give global ranks as whole numbers "
                ">= 0, e.g. [0, 7] (empty: rank 0 and the last rank)"
            )


@dataclass(frozen=True)
class RunConfig:
    name: str = opt("run", "run name: the run directory is <dir>/<name>")
    dir: str = opt("runs", "parent of run directories")
    resume: str = opt("auto", "auto = newest checkpoint that loads; none; or a checkpoint path")

    def validate(self) -> None:
        """The name is one directory under run.dir and the Slurm job name (`#SBATCH --job-name`):
        empty leaves the option without a value (Slurm reads the next line as the name), and `/`,
        `\\` or a leading dot make nested, hidden or escaping (`..`) run directories."""
        name = self.name
        if not name.strip():
            raise ConfigError(
                "run.name is empty: it names the run directory (run.dir/run.name) and the "
                "Slurm job; set one, e.g. run.name=vit_b16"
            )
        if "/" in name or "\\" in name:
            raise ConfigError(
                f"run.name={name!r}: must be one path component, without '/' or '\\' (the "
                "run directory is run.dir/run.name); put parent folders in run.dir"
            )
        if name.startswith("."):
            fix = name.lstrip(".") or "run"
            raise ConfigError(
                f"run.name={name!r}: must not start with '.' ('..' leaves run.dir, '.' is "
                f"run.dir itself, others hide the run directory); e.g. run.name={fix!r}"
            )
        for key, value in (("run.name", name), ("run.dir", self.dir)):
            check_pattern_free(key, value)


# sbatch(1), "filename pattern": in --output/--error paths `%` starts a replacement (%j, %t, %A, %a, %x,
# %4j...) and a backslash turns the replacements off; submitit 1.5.4 (core/utils.py, JobPaths) replaces
# %j, %t, %A, %a in its folder. The run directory holds the submitit folder and the logs sbatch names.
PATTERN_CHARS = {"%": "starts a file-name pattern (%j becomes the job id)", "\\": "turns the patterns off"}


def check_pattern_free(key: str, value: str) -> None:
    """Refuse a run path that sbatch or submitit would rewrite: the job's logs and its pickle would
    land in a directory that does not exist (sbatch's `%j`) or be named alike for every job (`\\`)."""
    for ch, why in PATTERN_CHARS.items():
        if ch in value:
            fix = value.replace(ch, "_")
            raise ConfigError(
                f"{key}={value!r}: {ch!r} {why} in the paths sbatch and submitit write (sbatch(1), "
                f"filename pattern), so the job's logs and pickle would not be where hpctrain looks; "
                f"choose one without it, e.g. {key}={fix!r}"
            )


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"doc": "the network"})
    data: DataConfig = field(default_factory=DataConfig, metadata={"doc": "datasets and loaders"})
    optim: OptimConfig = field(default_factory=OptimConfig, metadata={"doc": "optimizer and schedule"})
    train: TrainConfig = field(default_factory=TrainConfig, metadata={"doc": "the training loop"})
    aug: AugConfig = field(default_factory=AugConfig, metadata={"doc": "augmentation and label smoothing"})
    compile: CompileConfig = field(default_factory=CompileConfig, metadata={"doc": "torch.compile"})
    dist: DistConfig = field(default_factory=DistConfig, metadata={"doc": "data parallelism: DDP or FSDP"})
    ckpt: CkptConfig = field(default_factory=CkptConfig, metadata={"doc": "checkpoints"})
    health: HealthConfig = field(
        default_factory=HealthConfig, metadata={"doc": "faults: guard, rollback, watchdog, preflight, stragglers"}
    )
    log: LogConfig = field(default_factory=LogConfig, metadata={"doc": "metric lines, trackers, profiling"})
    run: RunConfig = field(default_factory=RunConfig, metadata={"doc": "where results go"})

    def validate(self) -> None:
        for problem in rule_problems(self):
            raise ConfigError(problem)
        check_shapes(self)

    @property
    def hang_s(self) -> float:
        """The hang watchdog's timeout in seconds (0: off): health.hang_timeout_s, or half of dist.pg_timeout_s."""
        h = self.health.hang_timeout_s
        return self.dist.pg_timeout_s / 2 if h is None else float(h)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.dir) / self.run.name

    def per_rank_batch(self, world_size: int) -> int:
        """Micro-batch per rank; the global batch must split evenly."""
        check_batch(self, world_size)
        return self.data.global_batch // (world_size * self.train.accum_steps)

    @property
    def peak_lr(self) -> float:
        """optim.lr moved from optim.lr_ref_batch to data.global_batch by optim.lr_scaling (no reference
        batch, or `none`: as written)."""
        o = self.optim
        if not o.lr_ref_batch or o.lr_scaling == "none":
            return o.lr
        ratio = self.data.global_batch / o.lr_ref_batch
        return o.lr * (math.sqrt(ratio) if o.lr_scaling == "sqrt" else ratio)


SECTIONS = tuple(f.name for f in dataclasses.fields(Config))  # in the order a config file lists them


def check_batch(cfg: Config, world_size: int) -> None:
    div = world_size * cfg.train.accum_steps
    if cfg.data.global_batch % div:
        raise ConfigError(
            f"data.global_batch={cfg.data.global_batch} is not divisible by world size {world_size} × "
            f"train.accum_steps {cfg.train.accum_steps} = {div}; pick a multiple of {div} "
            f"(e.g. {max(div, cfg.data.global_batch // div * div)}) or change the number of ranks"
        )


# --------------------------------------------------------------------------- rules across sections


def rule_problems(cfg: Config) -> list[str]:
    """Settings of different sections that cannot run together, each as a one-line message with its
    fix. static_graph breaks under no_sync (pytorch/pytorch#143580): refused, not left to crash. The
    hang watchdog must fire first, with time left to dump before the collectives time out."""
    t, a, d, dist, h = cfg.train, cfg.aug, cfg.data, cfg.dist, cfg.health
    out = []
    spec = OPTIMIZERS.get(cfg.optim.name)
    if spec and spec.fsdp_refusal and dist.parallel == "fsdp":
        out.append(f"optim.name={spec.name} {spec.fsdp_refusal}")
    if spec and not spec.grad_scaler and t.amp == "fp16":
        out.append(
            f"optim.name={spec.name} does not step under train.amp=fp16's GradScaler: set train.amp=bf16 or none"
        )
    if a.randaugment.strip() and d.loader == "torch":
        out.append(
            f"aug.randaugment={a.randaugment!r} needs the DALI loader (the torch loader has no "
            "RandAugment): set data.loader=dali, or clear aug.randaugment"
        )
    if t.ema > 0 and dist.parallel == "fsdp":
        out.append(
            "train.ema does not work with dist.parallel=fsdp: the EMA is a full fp32 copy of the "
            "model on every rank, the memory FSDP shards away; set train.ema=0, or use "
            "dist.parallel=ddp if the model and its EMA fit on one GPU"
        )
    if dist.ddp_static_graph == "always" and t.accum_steps > 1:
        out.append(
            "dist.ddp_static_graph=always does not work with train.accum_steps > 1 (DDP's "
            "no_sync breaks static_graph, pytorch/pytorch#143580): set "
            "dist.ddp_static_graph=auto or never"
        )
    if t.sdpa_backend in ("flash", "cudnn") and t.amp == "none" and t.device != "cpu":
        out.append(
            f"train.sdpa_backend={t.sdpa_backend} with train.amp=none cannot run: that "
            "kernel takes only fp16/bf16 and choosing it turns the others off (the first "
            "forward fails with 'No available kernel'); set train.amp=bf16, or "
            "train.sdpa_backend=efficient or auto for fp32"
        )
    if h.hang_timeout_s and 2 * h.hang_timeout_s > dist.pg_timeout_s:
        out.append(
            f"health.hang_timeout_s={h.hang_timeout_s} must be at most half of "
            f"dist.pg_timeout_s={dist.pg_timeout_s}: the collective timeout would end the job "
            "before the stacks are written; raise dist.pg_timeout_s or lower "
            "health.hang_timeout_s (null: half of it, 0: off)"
        )
    return out


# --------------------------------------------------------------------------- shape rules


def check_shapes(cfg: Config) -> None:
    """The model's and the loaders' shape rules, checked when the config loads: a value that would
    make training die in its first step (after the job waited in the queue and wrote its run
    directory) fails here, on the login node, naming the keys and a value that works. Plain
    arithmetic on the config (models/vit.py and the loaders enforce the same rules again)."""
    for problem in shape_problems(cfg):
        raise ConfigError(problem)


def shape_problems(cfg: Config) -> list[str]:
    """Every broken shape rule as a one-line message with its fix (empty: all hold)."""
    m, d, t = cfg.model, cfg.data, cfg.train
    _, width, heads = arch_dims(m)
    out = []
    if m.img_size % m.patch_size:
        near = sorted(
            {
                max(m.patch_size, m.img_size // m.patch_size * m.patch_size),
                -(-m.img_size // m.patch_size) * m.patch_size,
            }
        )
        out.append(
            f"model.img_size={m.img_size} is not a multiple of model.patch_size={m.patch_size} (the image "
            f"is cut into patch_size × patch_size patches): use model.img_size="
            f"{' or '.join(map(str, near))}, or another patch size"
        )
    if width % heads:
        fits = [h for h in range(1, min(width, 64) + 1) if width % h == 0]
        near = min(fits, key=lambda h: (abs(h - heads), h))
        out.append(
            f"model width {width} is not divisible by model.heads={heads} (each head takes width/heads "
            f"channels): set model.heads={near}, or a model.width that is a multiple of {heads}"
        )
    if m.pos_embed.startswith("sincos"):
        need = 8 if m.pos_embed == "sincos_big_vision" else 4
        if width % 4 or width < need:
            out.append(
                f"model.pos_embed={m.pos_embed} needs a width divisible by 4 (sin and cos of both axes)"
                f"{' and at least 8' if need == 8 else ''}; the width is {width}: set model.width="
                f"{max(need, -(-width // 4) * 4)} or model.pos_embed=learn"
            )
    if int(width * m.mlp_ratio) < 1:
        out.append(
            f"model.mlp_ratio={m.mlp_ratio:g} gives an MLP of {int(width * m.mlp_ratio)} units at width "
            f"{width}: raise model.mlp_ratio (ViTs use 4)"
        )
    for key, values in (("data.mean", d.mean), ("data.std", d.std)):
        if len(values) != 3:
            out.append(
                f"{key} has {len(values)} values; images have 3 channels: give one per channel, e.g. "
                f"{key}=[0.5,0.5,0.5]"
            )
    if any(s <= 0 for s in d.std):
        out.append(f"data.std={list(d.std)}: every value must be > 0 (images are divided by it)")
    if len(cfg.optim.betas) != 2 or not all(0 <= b < 1 for b in cfg.optim.betas):
        out.append(f"optim.betas={list(cfg.optim.betas)}: expected two values in [0, 1), e.g. optim.betas=[0.9,0.999]")
    if cfg.data.global_batch % t.accum_steps:
        fit = max(t.accum_steps, cfg.data.global_batch // t.accum_steps * t.accum_steps)
        out.append(
            f"data.global_batch={cfg.data.global_batch} is not divisible by train.accum_steps={t.accum_steps} (each "
            f"optimizer step sums equal micro-batches): use data.global_batch={fit} or another "
            "train.accum_steps"
        )
    return out


# --------------------------------------------------------------------------- generic machinery


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if origin is tuple:
        return f"a list of {_describe(typing.get_args(tp)[0])}"
    if origin is list:
        return f"a list of {_describe(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    return {type(None): "null", bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`; return it in the field's canonical form."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: expected {_describe(tp)}, got {value!r}")
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"{key}: expected null, got {value!r}")
    if origin in (tuple, list):
        if isinstance(value, str) and origin is tuple:
            value = [v for v in value.replace(",", " ").split() if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected {_describe(tp)}, got {value!r}")
        inner = typing.get_args(tp)[0]
        items = [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of names to values, got {value!r}")
        kt, vt = typing.get_args(tp)
        return {_coerce(k, kt, key): _coerce(v, vt, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 3e-4 (no dot) as a string
            with contextlib.suppress(ValueError):
                value = float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"{key}: expected a finite number, got {value!r}")
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported type {tp}")


def _check_bounds(value: Any, meta: typing.Mapping, key: str) -> None:
    choices = meta.get("choices")
    if choices and value not in choices:
        near = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(map(str, choices))}{hint}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        lo, hi = meta.get("lo"), meta.get("hi")
        if lo is not None and (value <= lo if meta.get("lo_open") else value < lo):
            bound = f"> {lo:g}" if meta.get("lo_open") else f">= {lo:g}"
            raise ConfigError(f"{key}={value!r} is out of range: must be {bound}")
        if hi is not None and value > hi:
            raise ConfigError(f"{key}={value!r} is out of range: must be <= {hi:g}")


def control_char(text: str) -> str | None:
    """The first control character (Unicode category Cc) in `text`, escaped as Python writes it
    (`\\n`, `\\x1b`), or None."""
    for ch in text:
        if unicodedata.category(ch) == "Cc":
            return repr(ch)[1:-1]
    return None


def check_text(text: str, key: str) -> None:
    """Refuse control characters: values reach batch-script lines, `#SBATCH` options, comments and
    file names, where a newline ends the line (the rest runs as a command on the compute node)
    and the others garble or hide what is written."""
    ch = control_char(text)
    if ch:
        raise ConfigError(
            f"{key}: contains a control character ({ch}); remove it: values reach the "
            "batch script and file names, where it would break the line"
        )


def _check_strings(value: Any, key: str) -> None:
    """`check_text` on every string in a coerced value: list items, mapping keys and values."""
    if isinstance(value, str):
        check_text(value, key)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_strings(v, f"{key}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_strings(k, f"{key} (key {k!r})")
            _check_strings(v, f"{key}.{k}")


# Names other tools give our keys (timm/DeiT arguments, Hugging Face TrainingArguments, Lightning,
# big_vision): an unknown key found here points at ours. Keyed by the last part of the key.
SYNONYMS = {
    "learning_rate": "optim.lr",
    "lr": "optim.lr",
    "base_lr": "optim.lr",
    "blr": "optim.lr",
    "weight_decay": "optim.weight_decay",
    "wd": "optim.weight_decay",
    "optimizer": "optim.name",
    "opt": "optim.name",
    "warmup_epochs": "optim.warmup_epochs",
    "warmup": "optim.warmup_epochs",
    "warmup_steps": "optim.warmup_steps",
    "lr_warmup_steps": "optim.warmup_steps",
    "min_learning_rate": "optim.min_lr",
    "min_lr": "optim.min_lr",
    "sched": "optim.schedule",
    "lr_scheduler_type": "optim.schedule",
    "scheduler": "optim.schedule",
    "clip_grad_norm": "optim.clip_grad",
    "max_grad_norm": "optim.clip_grad",
    "gradient_clip_val": "optim.clip_grad",
    "layer_decay": "optim.layer_decay",
    "momentum": "optim.momentum",
    "epochs": "train.epochs",
    "num_epochs": "train.epochs",
    "num_train_epochs": "train.epochs",
    "max_epochs": "train.epochs",
    "total_epochs": "train.epochs",
    "max_steps": "train.max_steps",
    "total_steps": "train.max_steps",
    "gradient_accumulation_steps": "train.accum_steps",
    "accumulate_grad_batches": "train.accum_steps",
    "accum_iter": "train.accum_steps",
    "precision": "train.amp",
    "mixed_precision": "train.amp",
    "fp16": "train.amp",
    "bf16": "train.amp",
    "seed": "train.seed",
    "smoothing": "aug.label_smoothing",
    "label_smoothing": "aug.label_smoothing",
    "model_ema_decay": "train.ema",
    "ema_decay": "train.ema",
    "batch_size": "data.global_batch",
    "global_batch_size": "data.global_batch",
    "train_batch_size": "data.global_batch",
    "per_device_train_batch_size": "data.global_batch",
    "num_workers": "data.workers",
    "dataloader_num_workers": "data.workers",
    "data_path": "data.root",
    "data_dir": "data.root",
    "dataset_path": "data.root",
    "aa": "aug.randaugment",
    "auto_augment": "aug.randaugment",
    "input_size": "model.img_size",
    "image_size": "model.img_size",
    "img_size": "model.img_size",
    "patch": "model.patch_size",
    "drop_path_rate": "model.drop_path",
    "nb_classes": "model.num_classes",
    "drop": "model.drop_rate",
    "drop_rate": "model.drop_rate",
    "dropout": "model.drop_rate",
    "dropout_rate": "model.drop_rate",
    "proj_drop_rate": "model.drop_rate",
    "attn_drop": "model.attn_drop_rate",
    "attention_dropout_rate": "model.attn_drop_rate",
    "attn_drop_rate": "model.attn_drop_rate",
    "evals": "data.eval_splits",
    "eval_split": "data.eval_splits",
    "num_labels": "model.num_classes",
    "model": "model.arch",
    "finetune": "model.init_from",
    "output_dir": "run.dir",
    "save_steps": "ckpt.every",
    "checkpoint_every": "ckpt.every",
    "resume": "run.resume",
}


def _synonym(key: str, where: str) -> str | None:
    """Our name for a key written as another tool names it, unless it is that key already."""
    ours = SYNONYMS.get(key.rsplit(".", 1)[-1].lower().replace("-", "_"))
    return ours if ours and ours != f"{where}{key}" else None


def _near(key: str, valid: list[str], where: str, mapping: bool) -> str:
    """The "did you mean" for an unknown key ("": no name is near). `mapping`: the key holds one,
    so a near name among `valid` is a section to rename to."""
    near = difflib.get_close_matches(key.rsplit(".", 1)[-1], valid, n=1, cutoff=0.5)
    ours = _synonym(key, where)
    if mapping and near:
        return f"did you mean the section {near[0]!r} (`{near[0]}:` in a file, --set {near[0]}.… on the command line)?"
    if ours:
        section, name = ours.split(".")
        return f"did you mean {ours!r} (`{section}: {{{name}: …}}` in a file, --set {ours}=… on the command line)?"
    return f"did you mean {where}{near[0]!r}?" if near else ""


def unknown_key_error(key: str, valid: typing.Iterable[str], where: str, mapping: bool = False) -> ConfigError:
    """`mapping`: the key holds one, so a near name among `valid` is a section to rename to."""
    valid = sorted(valid)
    hint = _near(key, valid, where, mapping)
    return ConfigError(f"unknown config key {where}{key!r}: {hint + ' ' if hint else ''}valid keys: {', '.join(valid)}")


def unknown_keys(cls: type, data: Any, prefix: str = "") -> list[tuple[str, list[str], str, bool]]:
    """Every key of `data` and of its sections that `cls` has no field for, as (key, the valid keys
    beside it, its section's prefix, whether it holds a mapping): all of them in one error, not the first."""
    if not isinstance(data, dict):
        return []
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    out = []
    for key, value in data.items():
        if key not in fields:
            out.append((str(key), sorted(fields), prefix, isinstance(value, dict)))
        elif dataclasses.is_dataclass(hints[key]):
            out += unknown_keys(hints[key], value, f"{prefix}{key}.")
    return out


def unknown_keys_error(found: list[tuple[str, list[str], str, bool]]) -> ConfigError:
    """One error for every unknown key: one key with the valid keys beside it, several each with its hint."""
    if len(found) == 1:
        return unknown_key_error(*found[0])
    each = []
    for key, valid, where, mapping in found:
        hint = _near(key, valid, where, mapping)
        each.append(f"{where}{key!r}" + (f" ({hint})" if hint else ""))
    return ConfigError(
        f"{len(found)} unknown config keys: {'; '.join(each)}: fix or drop each "
        "(`hpctrain config --keys` lists every valid key)"
    )


def build(cls: type, data: Any, prefix: str = "") -> Any:
    """Make dataclass `cls` from a nested mapping, validating every key and value."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        name = prefix.rstrip(".") or "the config file"
        raise ConfigError(f"{name}: expected a mapping of keys to values, got {data!r}")
    found = unknown_keys(cls, data, prefix)  # the whole tree's: a nested build finds none left
    if found:
        raise unknown_keys_error(found)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            continue
        tp, key = hints[name], f"{prefix}{name}"
        if dataclasses.is_dataclass(tp):
            kwargs[name] = build(tp, data[name], f"{key}.")
        else:
            value = _coerce(data[name], tp, key)
            _check_strings(value, key)
            _check_bounds(value, f.metadata, key)
            kwargs[name] = value
    obj = cls(**kwargs)
    check = getattr(obj, "validate", None)
    if check:
        check()
    return obj


def to_dict(obj: Any) -> dict:
    """Plain nested dict (lists for tuples): YAML-, JSON- and checkpoint-safe."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(obj)


def parse_override(item: str) -> tuple[list[str], Any]:
    """`section.key=value` → (["section", "key"], value parsed as YAML)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. optim.lr=1e-3")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. optim.lr=1e-3")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, (dict, list)) and not raw.strip().startswith(("[", "{")):
        value = raw
    if isinstance(value, (str, int, float, bool, list)) or value is None:
        return key.split("."), value
    return key.split("."), raw  # dates, sets and other YAML types: take the text as written


def apply_overrides(data: dict, overrides: typing.Iterable[str]) -> dict:
    """Apply `--set` items to a nested mapping (copied); unknown keys are caught by `build`."""
    data = copy.deepcopy(data) if data else {}
    for item in overrides:
        path, value = parse_override(item)
        node = data
        for part in path[:-1]:
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"--set {item!r}: {part!r} is a value, not a section")
            node = nxt
        node[path[-1]] = value
    return data


SET_ENV = "HPCTRAIN_SET"


def encode_overrides(items: typing.Sequence[str]) -> str:
    """`HPCTRAIN_SET` text for overrides: a JSON list of "key=value" strings, so any value (with
    `;`, `=`, quotes, spaces, non-ASCII) round-trips; no overrides: empty."""
    return json.dumps(list(items), ensure_ascii=False) if items else ""


def _legacy_joined(line: str) -> bool:
    """`a.b=1;c.d=2`: the old `;`-joined form, which would now set a.b to `1;c.d=2` silently."""
    sections = "|".join(f.name for f in dataclasses.fields(Config))
    return re.search(rf";\s*(?:{sections})(?:\.[^=;\s]+)+\s*=", line) is not None


def decode_overrides(text: str) -> list[str]:
    """Overrides from `HPCTRAIN_SET`: a JSON list (what the generator writes), or one override per
    line (typed by hand). The old `;`-joined form is refused, not misread."""
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            items = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise ConfigError(
                f"{SET_ENV}: not a JSON list ({e.msg} at character {e.pos}); write it as "
                f'{SET_ENV}=\'["optim.lr=1e-3", "train.epochs=5"]\''
            ) from None
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ConfigError(
                f'{SET_ENV}: expected a JSON list of "key=value" strings, got {stripped!r}; '
                f'e.g. {SET_ENV}=\'["optim.lr=1e-3", "train.epochs=5"]\''
            )
        return items
    items = [line.rstrip("\r") for line in text.split("\n") if line.strip()]
    for line in items:
        if _legacy_joined(line):
            fix = json.dumps([p.strip() for p in line.split(";") if p.strip()])  # ASCII: one line
            raise ConfigError(
                f"{SET_ENV}: {line!r} looks like ';'-separated overrides, which are no "
                f"longer split (a value may contain ';'); use a JSON list: "
                f"{SET_ENV}={shlex.quote(fix)} (or one override per line)"
            )
    return items


def yaml_error(p: Path, e: yaml.YAMLError) -> ConfigError:
    """One line: `FILE:LINE:COLUMN: not valid YAML: <problem> (<context>)`, 1-based as editors count."""
    mark = getattr(e, "problem_mark", None)
    where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark else str(p)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    context, cmark = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and cmark and (not mark or cmark.line != mark.line):
        context += f" that starts at line {cmark.line + 1}, column {cmark.column + 1}"
    return ConfigError(f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else ""))


def unreadable(p: Path) -> str:
    """The one line for a file this user may not read (it or a directory above it)."""
    return (
        f"cannot read {str(p)!r}: permission denied (the file, or a directory above it, is not readable by "
        "you): ask its owner to share it, or give a copy of your own"
    )


def read_yaml(path: str | Path) -> dict:
    p = Path(path)
    try:
        if p.is_dir():
            raise ConfigError(f"{str(p)!r} is a directory: give a YAML config file (e.g. configs/digits_vit.yaml)")
        if not p.is_file():
            raise ConfigError(f"file {str(p)!r} does not exist")
        data = yaml.safe_load(p.read_text())
    except PermissionError:  # the file, or a directory above it, is another user's (a shared site)
        raise ConfigError(unreadable(p)) from None
    except yaml.YAMLError as e:
        raise yaml_error(p, e) from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a text file") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping of sections (model:, data:, …) at the top level")
    return data


def find_config(name: str | Path) -> Path:
    """A path as given, else a shipped config by name (`vit_b16_imagenet_4k`, `.yaml` optional, or the
    checkout's `configs/<name>.yaml` from any directory)."""
    p = Path(name)
    if p.exists():
        return p
    found = shipped.lookup(p, CONFIG_DIR, (".yaml",))
    if found is None:
        raise ConfigError(
            f"config {str(name)!r} not found: give a YAML file or a shipped config: "
            f"{shipped.names(shipped.configs())} (`hpctrain config show NAME` prints one)"
        )
    return found


def load(path: str | Path | None = None, overrides: typing.Iterable[str] = (), data: dict | None = None) -> Config:
    """Load a config file (or a mapping), apply overrides, validate. Keys an earlier release named
    otherwise (config_moves.MOVES) are read under their new names, with a note on stderr each."""
    raw = data if data is not None else (read_yaml(find_config(path)) if path else {})
    try:
        raw, notes = migrate_data(raw, str(path) if path else "the config")
        for item in overrides:
            new, moved = migrate_override(item, raw)
            raw = apply_overrides(raw, [new] if new else [])
            notes += [moved] if moved else []
    except MoveError as e:
        raise ConfigError(str(e)) from None
    for line in notes:
        print(line, file=sys.stderr)
    return build(Config, raw)


def save(cfg: Any, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


MORE = " (docs/configs.md)"  # after the doc of a key with more to say there


def describe(cls: type = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, doc) for every field: `hpctrain config --keys`, one line each (the doc of a key
    with a longer explanation ends with MORE)."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            rows += describe(tp, f"{prefix}{f.name}.")
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            doc = f.metadata.get("doc", "") + (MORE if f.metadata.get("more") else "")
            rows.append((f"{prefix}{f.name}", repr(default), doc))
    return rows

"""The schema: one frozen dataclass per section of a config file (`ModelConfig` … `RunConfig`), each key
with its type, default, one-line doc and bounds (`opt`) and the section's own rules (`validate`), and
`Config`, which holds the sections in the order a file lists them (`SECTIONS`) and runs the rules
across sections (rules.py) when it is built."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.batch_split import rank_share
from hpctrain.config.field import ConfigError, opt
from hpctrain.config.rules import check_batch, check_shapes, rule_problems
from hpctrain.config.text import check_pattern_free, step_window
from hpctrain.optim_spec import OPTIMIZERS
from hpctrain.randaug_spec import parse_randaugment

TRACKERS = ("tensorboard", "mlflow", "wandb")  # log.trackers: what hpctrain.train.observe.trackers can feed


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
    sample_hashes: bool = opt(
        False,
        "each step's hash of its samples and augmentation seeds, to <run>/sample_hashes.jsonl",
        more=True,
    )
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

    @property
    def micro_batch(self) -> int:
        """g: a micro-step's global batch (data.global_batch / train.accum_steps), which the ranks split."""
        return self.data.global_batch // self.train.accum_steps

    def rank_batch(self, world_size: int, rank: int) -> int:
        """Rank `rank`'s micro-batch: its share of g, one more than ⌊g/W⌋ on the first g mod W ranks
        (batch_split.rank_share, as the samplers split; the loop weights the loss to match)."""
        check_batch(self, world_size)
        return rank_share(self.micro_batch, rank, world_size)[1]

    def per_rank_batch(self, world_size: int) -> int:
        """The largest micro-batch of any rank (⌈g/W⌉): what memory, warm-ups, evaluation and reports size by."""
        return self.rank_batch(world_size, 0)

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

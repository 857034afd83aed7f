"""Rules across sections: settings of different sections that cannot run together (`rule_problems`),
the model's and the loaders' shape rules (`check_shapes`), and the global batch's split over the
ranks (`check_batch`: uneven shares are fine, an empty one is not). `Config.validate` runs the first
two when a config loads, on the login node: plain arithmetic on the config, no torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpctrain.config.field import ConfigError
from hpctrain.models.arch import arch_dims
from hpctrain.optim_spec import OPTIMIZERS

if TYPE_CHECKING:  # the annotations' type only: schema.py imports this module (Config.validate runs these rules)
    from hpctrain.config.schema import Config


def check_batch(cfg: Config, world_size: int) -> None:
    """The global batch splits over `world_size` ranks: whole micro-steps (global_batch divisible by
    accum_steps) and at least one sample per rank per micro-step. Uneven shares are fine (data.sampling)."""
    g, accum = cfg.data.global_batch, cfg.train.accum_steps
    if g % accum:
        raise ConfigError(
            f"data.global_batch={g} is not divisible by train.accum_steps={accum}: use data.global_batch="
            f"{max(accum, g // accum * accum)} or another train.accum_steps"
        )
    if g // accum < world_size:
        fits = [a for a in range(1, accum) if g % a == 0 and g // a >= world_size]
        fix = f"set train.accum_steps={fits[-1]}, " if fits else ""
        raise ConfigError(
            f"data.global_batch={g} / train.accum_steps={accum} gives {g // accum} samples per micro-step, fewer "
            f"than the {world_size} ranks (each needs one): {fix}use at most {g // accum} ranks, or raise "
            "data.global_batch"
        )


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
    if cfg.log.sample_hashes and (d.loader == "synthetic" or d.format == "wds"):
        out.append(
            f"log.sample_hashes needs a loader that names its samples; data.loader={d.loader} "
            f"data.format={d.format} does not (synthetic data, WebDataset shards' stream order): use "
            "data.format=folder with data.loader=torch or dali, or set log.sample_hashes=false"
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

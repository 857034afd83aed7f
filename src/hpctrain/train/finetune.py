"""Start a model from weights (`model.init_from`): read them, adapt what may be adapted, refuse the rest.

Sources: a timm-named state_dict (`.safetensors`, `.pt`/`.pth`; also a training checkpoint that wraps
one under `model`/`state_dict`, as DeiT's, MAE's and timm's do), an `hpctrain export` file, an
hpctrain checkpoint of either format, or a run directory (its newest checkpoint). A path only:
jobs run where there may be no network, and a download per rank would be 128 downloads.

Adapted, as timm's `checkpoint_filter_fn` and the ViT paper's fine-tuning do, and always logged:
the position embedding is resampled (bicubic, prefix tokens kept) to the model's patch grid, and a
head of another class count is replaced by the model's freshly initialised one. A pre-trained
encoder without head (MAE's layout) starts the head, and with `model.final_norm=pooled` the norm after the
pool, as initialised; its final token norm is then unused (MAE main_finetune.py:248-254 loads it so,
non-strictly). Everything else that differs (missing or unexpected keys, other shapes) is refused
with the keys and shapes, never dropped in silence. docs/finetune.md has the sources.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from hpctrain.errors import UserError
from hpctrain.train.ckpt import checkpoint as ckpt
from hpctrain.train.ckpt import export

log = logging.getLogger("hpctrain")
HEAD = ("head.weight", "head.bias")
FC_NORM = ("fc_norm.weight", "fc_norm.bias")  # timm's norm after the pool (MAE's global_pool)
TOKEN_NORM = ("norm.weight", "norm.bias")  # the norm on the tokens that fc_norm replaces
PREFIXES = ("module.", "_orig_mod.")  # DDP's and torch.compile's wrappers


class InitError(UserError, ValueError):
    """Weights that cannot start this model, with the keys and shapes that differ."""


def _is_run_or_checkpoint(p: Path) -> bool:
    return ckpt.PATTERN.match(p.name) is not None or (p.is_dir() and ckpt.ckpt_dir(p).is_dir())


def _unwrap(obj: dict, path: Path, ema: bool, what: str = "model.init_from") -> dict[str, torch.Tensor]:
    """The state_dict inside a file: hpctrain checkpoint (model/ema), timm train checkpoint
    (state_dict/state_dict_ema), DeiT/MAE (model), or the state_dict itself."""
    if "step" in obj and "model" in obj:  # an hpctrain single-file checkpoint under another name
        key = "ema" if ema else "model"
    elif "state_dict" in obj or "state_dict_ema" in obj:
        key = "state_dict_ema" if ema else "state_dict"
    elif "model" in obj and isinstance(obj["model"], dict):
        key = None if ema else "model"
    else:
        key = None if ema else ""
    if key is None or (key and not isinstance(obj.get(key), dict)):
        raise InitError(f"{what}={path} has no EMA weights (no ema or state_dict_ema entry): set model.init_ema=false")
    sd = obj[key] if key else obj
    out = {}
    for k, v in sd.items():
        if not isinstance(v, torch.Tensor):
            raise InitError(
                f"{what}={path}: entry {k!r} is not a tensor; give a state_dict file (e.g. from `hpctrain export`)"
            )
        for pre in PREFIXES:
            k = k[len(pre) :] if k.startswith(pre) else k
        out[k] = v
    return out


def read_weights(
    source: str | Path, ema: bool = False, what: str = "model.init_from"
) -> tuple[dict[str, torch.Tensor], str]:
    """(state_dict, where it came from) of an init_from / --weights source (`what` names it in errors)."""
    p = Path(source)
    if not p.exists():
        raise InitError(
            f"{what}={source}: no such file or directory; give the path of a .safetensors/"
            ".pt/.pth state_dict, an hpctrain checkpoint or run directory (no URLs or hub names)"
        )
    if _is_run_or_checkpoint(p):
        path = export.find(p)
        sd, _ = export.weights(path, ema)
        return sd, f"{path}{' (EMA)' if ema else ''}"
    if p.is_dir():
        raise InitError(
            f"{what}={source} is a directory without checkpoints/: give a run directory, "
            "a checkpoint (step-<n>.pt or step-<n>/) or a weights file"
        )
    if p.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file  # safetensors: only for .safetensors weights
        except ImportError:
            raise InitError("reading .safetensors needs the safetensors package (part of hpctrain[train])") from None
        if ema:
            raise InitError(
                f"{what}={source} is a plain state_dict (.safetensors): it has no EMA weights; "
                "set model.init_ema=false (or export the EMA weights: hpctrain export RUN --ema)"
            )
        return _unwrap(load_file(str(p)), p, False, what), str(p)
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # pickled code, not a torch file: refused, not run
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InitError(f"{what}={source} cannot be loaded safely (weights_only): {first}") from None
    if not isinstance(obj, dict):
        raise InitError(f"{what}={source} holds a {type(obj).__name__}, not a state_dict")
    return _unwrap(obj, p, ema, what), f"{source}{' (EMA)' if ema else ''}"


def resample_pos_embed(pe: torch.Tensor, grid: int, prefix: int) -> torch.Tensor:
    """timm's resample_abs_pos_embed for square grids: the prefix (class) tokens kept as they are,
    the grid interpolated bicubic with antialias (as timm's default) to grid × grid."""
    old = int(math.isqrt(pe.shape[1] - prefix))
    head, body = pe[:, :prefix], pe[:, prefix:]
    body = body.float().reshape(1, old, old, -1).permute(0, 3, 1, 2)
    body = F.interpolate(body, size=(grid, grid), mode="bicubic", antialias=True, align_corners=False)
    body = body.permute(0, 2, 3, 1).reshape(1, grid * grid, -1).to(pe.dtype)
    return torch.cat([head, body], dim=1)


def _shape(t: torch.Tensor) -> str:
    return "×".join(map(str, t.shape)) or "scalar"


def adapt(
    sd: dict[str, torch.Tensor], model: torch.nn.Module, source: str, new_head: bool = True
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """`sd` made to fit `model`: (the state_dict to load, the notes on what was adapted).

    `new_head=False` (evaluation) refuses a head of another class count instead of re-initialising it."""
    want = model.state_dict()
    sd = dict(sd)
    notes: list[str] = []
    pe, mpe = sd.get("pos_embed"), want.get("pos_embed")
    if pe is not None and mpe is not None and pe.shape != mpe.shape:
        prefix = getattr(model, "num_prefix", 1)
        n = pe.shape[1] - prefix if pe.ndim == 3 else -1
        grid = model.patch_embed.grid
        if pe.ndim == 3 and n > 0 and math.isqrt(n) ** 2 == n and pe.shape[2] == mpe.shape[2]:
            old = math.isqrt(n)
            sd["pos_embed"] = resample_pos_embed(pe, grid, prefix)
            notes.append(
                f"position embedding resampled from a {old}×{old} to a {grid}×{grid} grid (bicubic"
                f"{', class token kept' if prefix else ''})"
            )
    missing_head = []
    hw, mhw = sd.get("head.weight"), want.get("head.weight")
    if hw is not None and mhw is not None and hw.shape != mhw.shape and hw.ndim == 2 and hw.shape[1] == mhw.shape[1]:
        if not new_head:
            raise InitError(
                f"{source} has a {hw.shape[0]}-class head but model.num_classes={mhw.shape[0]}: "
                f"evaluate with --set model.num_classes={hw.shape[0]} (and data with those classes)"
            )
        for k in HEAD:
            sd.pop(k, None)
        missing_head = list(HEAD)
        head_init = getattr(model, "head_init", "")
        notes.append(
            f"new head: the checkpoint's has {hw.shape[0]} classes, model.num_classes={mhw.shape[0]}; "
            f"re-initialised ({'model.head_init=' + head_init if head_init else 'fresh init'})"
        )
    # a pre-trained encoder (MAE's layout: no head, no fc_norm; its token norm unused with fc_norm)
    fresh = [k for k in (*HEAD, *FC_NORM) if new_head and k in want and k not in sd and k not in missing_head]
    unused = [k for k in TOKEN_NORM if k in sd and k not in want and FC_NORM[0] in fresh]
    if fresh:
        notes.append(
            f"not in the file, left as initialised: {', '.join(fresh)}"
            + (f"; unused (the model normalises after the pool): {', '.join(unused)}" if unused else "")
        )
    for k in unused:
        sd.pop(k)
    missing = [k for k in want if k not in sd and k not in missing_head and k not in fresh]
    unexpected = [k for k in sd if k not in want]
    shapes = [k for k in sd if k in want and sd[k].shape != want[k].shape]
    if missing or unexpected or shapes:
        raise InitError(
            f"{source} does not fit this model: "
            + "; ".join(
                filter(
                    None,
                    [
                        _listing(
                            "shapes differ",
                            [f"{k} {_shape(sd[k])} in the file vs {_shape(want[k])} in the model" for k in shapes],
                        ),
                        _listing("missing from the file", [f"{k} {_shape(want[k])}" for k in missing]),
                        _listing("not in the model", [f"{k} {_shape(sd[k])}" for k in unexpected]),
                    ],
                )
            )
            + ". Set the model.* keys the weights were trained with (depth, width, heads, patch_size, pool, "
            "class_token, final_norm, rep_size: see the source run's config.yaml)"
        )
    return sd, notes


def _listing(what: str, items: list[str], most: int = 8) -> str:
    if not items:
        return ""
    more = f", … and {len(items) - most} more" if len(items) > most else ""
    return f"{what}: {', '.join(items[:most])}{more}"


def load_into(
    model: torch.nn.Module, source: str | Path, ema: bool = False, new_head: bool = True, what: str = "model.init_from"
) -> list[str]:
    """Read `source`, adapt it to `model`, load it; log and return what was adapted."""
    sd, where = read_weights(source, ema, what)
    sd, notes = adapt(sd, model, where, new_head)
    model.load_state_dict(sd, strict=False)  # adapt() has refused every key but the re-initialised head
    log.info("initialised the model from %s%s", where, "".join(f"; {n}" for n in notes))
    return notes

"""One consolidated, timm-compatible state_dict from a run's checkpoint of either format.

The model's parameter names are timm's (models/vit.py), so the exported file loads into
`timm.create_model("vit_base_patch16_224")` as into `build_vit`. A sharded checkpoint is read in
this one process without a process group (DCP loads alone when none is initialised); no GPU and no job needed.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hpctrain.errors import UserError
from hpctrain.run.layout import run_dir_named
from hpctrain.train.ckpt import checkpoint as ckpt

SUFFIXES = (".safetensors", ".pt")


def find(run: str | Path, step: int | None = None) -> Path:
    """The checkpoint to export: `run` is a run directory (its newest checkpoint, or `step`'s) or a
    checkpoint itself."""
    run = Path(run)
    if ckpt.PATTERN.match(run.name) and run.exists():
        return run
    run = run_dir_named(str(run)) or run  # a run's name under ./runs, as status and eval take it
    found = ckpt.list_checkpoints(run)
    if not found:
        raise UserError(
            f"no checkpoint in {ckpt.ckpt_dir(run)}: give a run directory that has one (or a checkpoint path)"
        )
    if step is None:
        return found[0]
    for p in found:
        if ckpt.step_of(p) == step:
            return p
    have = ", ".join(str(ckpt.step_of(p)) for p in found)
    raise UserError(f"{run} has no checkpoint of step {step}; it has steps {have}")


def weights(path: Path, ema: bool = False) -> tuple[dict[str, torch.Tensor], dict]:
    """(the model's or the EMA's state_dict, the checkpoint's non-tensor part)."""
    st = ckpt.load(path)
    part = "ema" if ema else "model"
    sd = st.get(part)
    if not sd:
        raise UserError(
            f"checkpoint {path} has no EMA weights (trained with train.ema=0): export without --ema"
            if ema
            else f"checkpoint {path} has no model weights"
        )
    info = {k: v for k, v in st.items() if k not in ("model", "optimizer", "ema", "rng")}
    return {k: v.detach().contiguous() for k, v in sd.items()}, info


def export(run: str | Path, out: str | Path, step: int | None = None, ema: bool = False) -> tuple[Path, Path]:
    """Write the weights to `out` (.safetensors or .pt, by its suffix); returns (checkpoint, out)."""
    out = Path(out)
    if out.suffix not in SUFFIXES:
        raise UserError(f"-o {out}: the file name must end in .safetensors or .pt (the format is chosen by it)")
    if not out.parent.is_dir():  # before the checkpoint is read: nothing is lost to a typo
        raise UserError(f"-o {out}: the folder {out.parent} does not exist: create it, or write elsewhere")
    path = find(run, step)
    sd, info = weights(path, ema)
    if out.suffix == ".safetensors":
        try:
            from safetensors.torch import save as st_save  # safetensors: only for `-o *.safetensors`
        except ImportError:
            raise UserError(
                "writing .safetensors needs the safetensors package (pip install safetensors, "
                "part of hpctrain[train]); or export to a .pt file"
            ) from None
        meta = {"step": str(info.get("step")), "source": str(path), "weights": "ema" if ema else "model"}
        data = st_save(sd, metadata=meta)
        ckpt.save_file(out, lambda f: f.write(data))
    else:
        ckpt.save_file(out, lambda f: torch.save(sd, f))
    return path, out

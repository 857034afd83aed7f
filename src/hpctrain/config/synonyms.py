"""Unknown keys: every key of a file or a `--set` that the schema has no field for, found at once and
named in one error with a "did you mean": a near key, or ours for a name that another tool gives
it (`SYNONYMS`: timm/DeiT, Hugging Face, Lightning, big_vision)."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any

from hpctrain.config.field import ConfigError

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

"""Make sure the configured dataset exists before a run (only the demo set is made on demand).

`data.prepare: digits` fills the demo's own folder and nothing else: a mistyped data.root must
not quietly get a fresh copy of the digits (and train on it), and a shard folder
(data.format=wds) must never get image folders written into it. Any other path is written only
when asked by name: `hpctrain data digits OUT`.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from hpctrain.config import Config, ConfigError, ModelConfig, build, read_yaml
from hpctrain.config_moves import current
from hpctrain.data.folder import DataError, class_folders, class_mismatch
from hpctrain.data.prep.once import make_once
from hpctrain.data.wds import META, read_meta
from hpctrain.models.arch import arch_dims
from hpctrain.run.layout import CHECKPOINTS, CONFIG

DEMO_ROOT = "data/digits"  # configs/digits_vit.yaml's data.root, relative to the working directory


def is_demo_root(root: str | Path) -> bool:
    """`root` is the demo's own folder: DEMO_ROOT under the working directory."""
    return Path(root).expanduser().resolve() == (Path.cwd() / DEMO_ROOT).resolve()


def ensure_dataset(cfg: Config) -> None:
    """With `data.prepare: digits`, write the digits folder once (locked), at DEMO_ROOT only."""
    d = cfg.data
    if d.prepare != "digits" or d.loader == "synthetic":
        return
    root = Path(d.root).expanduser()
    write = f"hpctrain data digits {shlex.quote(DEMO_ROOT)}"
    if d.format == "wds":
        if (root / META).is_file():
            return
        raise ConfigError(
            f"data.root={d.root} holds no shards (no {META}); data.prepare=digits writes an image "
            f"folder, never shards: pack one with `{write} && hpctrain data pack {DEMO_ROOT} "
            f"{shlex.quote(d.root)}`, or set data.format=folder"
        )
    if (root / "train").is_dir() and (root / "val").is_dir():
        return
    if not is_demo_root(root):
        what = "does not exist" if not root.exists() else "has no train/ and val/"
        raise ConfigError(
            f"data.root={d.root} {what}; data.prepare=digits writes only the demo's own folder "
            f"{DEMO_ROOT} (under the working directory): fix data.root, or write the digits there "
            f"first with `hpctrain data digits {shlex.quote(d.root)}`"
        )

    def make() -> str:
        # numpy: data.prepare runs on the login node (ensure_dataset)
        from hpctrain.data.prep.digits import write_digits

        counts = write_digits(root)
        print(f"wrote the digits dataset to {root}: {counts['train']} train, {counts['val']} val images")
        return f"{counts}\n"

    make_once(root / ".complete", root / ".lock", make)


def input_problems(cfg: Config) -> list[str]:
    """What the run reads that is not on this machine, one line each with the fix: data.root (its
    train/ folder, or the shard index), data.exclude_file, model.init_from and a run.resume path
    (read as the task reads it: find_resume). The demo folder that ensure_dataset would write is
    not a problem. Torch-free: `submit` asks before it launches."""
    d, out = cfg.data, []
    if d.loader != "synthetic":
        root = Path(d.root).expanduser()
        if not d.root:
            out.append("data.root is empty: point it at an ImageNet-layout folder (or data.loader=synthetic)")
        elif d.format == "wds" and not (root / META).is_file():
            out.append(
                f"data.root={d.root} has no {META}: data.format=wds reads the output of "
                f"`hpctrain data pack ROOT {shlex.quote(d.root)}`"
            )
        elif (
            d.format == "folder"
            and not (root / "train").is_dir()
            and not (d.prepare == "digits" and is_demo_root(root))
        ):
            what = "does not exist" if not root.exists() else "has no train/ folder"
            out.append(
                f"data.root={d.root} {what}: give the folder that holds train/<class>/<images> "
                "(and val/), or make a small one with `hpctrain data digits OUT`"
            )
        if d.exclude_file and not Path(d.exclude_file).expanduser().is_file():
            out.append(
                f"data.exclude_file={d.exclude_file} does not exist: write it with `hpctrain data "
                "prepare-imagenet ROOT --exclude-bad FILE`, or clear data.exclude_file"
            )
    src = cfg.model.init_from
    if src and not Path(src).expanduser().exists():
        out.append(
            f"model.init_from={src} does not exist: give the path of a .safetensors/.pt/.pth state_dict, "
            "an hpctrain checkpoint or run directory (e.g. from `hpctrain export`)"
        )
    elif src:
        out += init_shape_problems(cfg.model, Path(src).expanduser())
    resume = cfg.run.resume
    if resume not in ("auto", "none") and not Path(resume).exists():
        out.append(f"run.resume={resume!r}: no such checkpoint; give auto, none or a checkpoint path")
    return out


def class_problem(cfg: Config) -> str | None:
    """The training data's classes against model.num_classes, in the loaders' words, so `submit`
    refuses a mismatch before any job starts rather than every rank after it. Counts the class
    folders of train/ (data.format=folder) or the shard index's classes (wds), reading no image;
    None when they agree or the data is not on this machine (input_problems says so)."""
    d = cfg.data
    if d.loader == "synthetic" or not d.root:
        return None
    root = Path(d.root).expanduser()
    if d.format == "wds":
        if not (root / META).is_file():
            return None
        try:
            meta = read_meta(root)
        except (ValueError, OSError):  # not a pack's meta.json: the job's own reading says what is wrong
            return None
        classes = meta.get("classes") if isinstance(meta, dict) else None
        return class_mismatch(root, len(classes), cfg.model.num_classes) if isinstance(classes, list) else None
    train = root / "train"
    if not train.is_dir():
        return None
    try:
        found = class_folders(train)
    except DataError as e:
        return str(e)
    except OSError:  # unreadable here: the job's nodes may read it
        return None
    return class_mismatch(train, len(found), cfg.model.num_classes)


# what decides the shapes of the weights model.init_from gives (the position embedding's grid is
# resampled and a head of another class count replaced: train/finetune.py)
SHAPE_KEYS = ("patch_size", "mlp_ratio", "rep_size")


def init_shape_problems(model: ModelConfig, src: Path) -> list[str]:
    """model.init_from an hpctrain run (or one of its checkpoints): its config.yaml tells the shapes
    of its weights, so a model they cannot start (another patch size, width, depth…) is refused
    before the job, not by its first rank. Other files are known only to torch: not checked here."""
    run = src.parent.parent if src.parent.name == CHECKPOINTS else src
    try:
        old = build(ModelConfig, current(read_yaml(run / CONFIG)).get("model") or {}, "model.")
    except (ConfigError, OSError, AttributeError):
        return []  # not an hpctrain run, or one of another release: the job's own check decides
    pairs = [(k, getattr(old, k), getattr(model, k)) for k in SHAPE_KEYS]
    pairs.append(("class_token", old.has_class_token, model.has_class_token))
    if old.has_fc_norm and not model.has_fc_norm:  # the other way round is MAE's fine-tuning: fc_norm starts fresh
        pairs.append(("final_norm", "pooled", "tokens"))
    diff = [f"model.{k}={a} there, {b} here" for k, a, b in pairs if a != b]
    diff += [
        f"model {k} {a} there, {b} here"
        for k, a, b in zip(("depth", "width"), arch_dims(old), arch_dims(model))
        if a != b
    ]
    if not diff:
        return []
    return [
        f"model.init_from={src}: its weights do not fit this model ({'; '.join(diff)}; {run / 'config.yaml'}): "
        "set those model.* keys as the source run had them (the position embedding is resampled to any "
        "model.img_size, a head of another model.num_classes replaced)"
    ]

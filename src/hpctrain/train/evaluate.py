"""`hpctrain eval`: weights on a split, exactly, on one process or on every rank of a job.

The numbers come from the training loop's own `evaluate` (train/eval_pass.py): the split is sharded by
global rank with padding that never counts, so top-1/top-5 are exact for any world size and equal
the run's last eval at the same weights and preprocessing. On top: per-class accuracy and the most
confused (true, predicted) pairs from the confusion matrix summed over ranks; rank 0 writes them.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import torch

from hpctrain.config import Config
from hpctrain.data.build import build_loaders
from hpctrain.models.vit import build_vit
from hpctrain.train import collective, finetune
from hpctrain.train import dist as distmod
from hpctrain.train.entry import setup_logging
from hpctrain.train.eval_pass import evaluate

log = logging.getLogger("hpctrain")
TOP_PAIRS = 10


def eval_config(cfg: Config, world: int) -> Config:
    """`cfg` with a global batch every world size splits: per rank `data.eval_batch_per_rank`, else the
    largest batch training takes per rank at this world size, ⌈g/W⌉ (so one process matches a
    one-process run; data.sampling's shares may be uneven)."""
    d, t = cfg.data, cfg.train
    per_rank = cfg.data.eval_batch_per_rank or max(1, -(-cfg.micro_batch // world))
    return dataclasses.replace(
        cfg,
        data=dataclasses.replace(d, global_batch=per_rank * world, eval_batch_per_rank=per_rank),
        train=dataclasses.replace(t, accum_steps=1),
    )


def class_names(cfg: Config, loader) -> list[str]:
    """The class folder names in label order, where the loader knows them; else the label numbers."""
    listing = getattr(getattr(loader, "dataset", None), "listing", None)
    names = list(listing.classes) if listing is not None else []
    if len(names) != cfg.model.num_classes:
        root = Path(cfg.data.root) / "train"
        names = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    return names if len(names) == cfg.model.num_classes else [str(i) for i in range(cfg.model.num_classes)]


def per_class(confusion, names: list[str]) -> list[dict[str, Any]]:
    rows = []
    for i, name in enumerate(names):
        n, ok = int(confusion[i].sum()), int(confusion[i, i])
        rows.append(
            {"label": i, "class": name, "count": n, "correct": ok, "top1": round(100.0 * ok / n, 4) if n else None}
        )
    return rows


def most_confused(confusion, names: list[str], k: int = TOP_PAIRS) -> list[dict[str, Any]]:
    """The k largest off-diagonal counts: (true class, predicted class, images, share of the true class)."""
    off = confusion.clone()
    off.fill_diagonal_(0)
    counts, idx = off.flatten().topk(min(k, off.numel()))
    k_cls = confusion.shape[1]
    out = []
    for c, i in zip(counts.tolist(), idx.tolist()):
        if c <= 0:
            break
        t, p = divmod(i, k_cls)
        total = int(confusion[t].sum())
        out.append(
            {
                "true": names[t],
                "predicted": names[p],
                "count": int(c),
                "share_of_true": round(100.0 * c / total, 4) if total else None,
            }
        )
    return out


def write_outputs(out_dir: Path, summary: dict, rows: list[dict]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "per_class.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["label", "class", "count", "correct", "top1"])
        w.writeheader()
        w.writerows(rows)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


def run(cfg: Config, weights: str, ema: bool = False, out_dir: Path | None = None) -> dict[str, Any]:
    """Evaluate `weights` (anything model.init_from takes) under `cfg` on this rank; rank 0 writes
    `out_dir`/summary.json and per_class.csv. Returns the summary (the same on every rank)."""
    info = distmod.detect()
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    want = cfg.train.device
    use_cuda = want == "cuda" or (want == "auto" and torch.cuda.is_available())
    device = (
        torch.device("cuda", info.local_rank % max(1, torch.cuda.device_count())) if use_cuda else torch.device("cpu")
    )
    if use_cuda:
        torch.cuda.set_device(device)
    setup_logging(None, info.rank)
    collective.init(info, "nccl" if use_cuda else "gloo", cfg.dist.pg_timeout_s)
    try:
        ecfg = eval_config(cfg, info.world_size)
        torch.manual_seed(cfg.train.seed)
        model = build_vit(cfg.model)
        notes = finetune.load_into(model, weights, ema, new_head=False, what="weights")
        model.to(device)
        _, loader = build_loaders(ecfg, info.rank, info.world_size, device)
        if loader is None:
            raise finetune.InitError(
                f"{cfg.data.root} has no val/ split to evaluate: add root/val/<class>/* or use --split minival"
            )
        res = evaluate(model, loader, cfg.train.amp, device, cfg.model.num_classes)
    finally:
        collective.shutdown()
    conf = res.pop("confusion")
    names = class_names(cfg, loader)
    rows = per_class(conf, names)
    summary = {
        "weights": str(weights),
        "ema": ema,
        "split": cfg.data.eval_splits[0],
        "data_root": cfg.data.root,
        "img_size": cfg.model.img_size,
        "crop_pct": cfg.data.crop_pct,
        "interpolation": cfg.data.interpolation,
        **res,
        "world_size": info.world_size,
        "adapted": notes,
        "most_confused": most_confused(conf, names),
    }
    if out_dir is not None:
        summary["per_class_csv"] = str(out_dir / "per_class.csv")
        if info.is_main:
            write_outputs(out_dir, summary, rows)
    return summary

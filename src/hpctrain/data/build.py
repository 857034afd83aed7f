"""Pick and build the train/val loaders a config asks for (`data.loader`)."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging

from hpctrain.config import Config, ConfigError
from hpctrain.data.augment import augment_spec
from hpctrain.data.folder import class_mismatch, read_exclusions, train_eval_listings
from hpctrain.data.loader import Loader
from hpctrain.data.workers import resolve_workers

log = logging.getLogger("hpctrain")


def resolve_loader(name: str) -> str:
    """`auto` → dali when DALI imports, else torch."""
    if name != "auto":
        return name
    return "dali" if importlib.util.find_spec("nvidia.dali") else "torch"


def build_loaders(cfg: Config, rank: int, world: int, device) -> tuple[Loader, Loader | None]:
    """(train, val) loaders for this rank; val is the headline eval split's (the first of
    `data.eval_splits` the data has), None when it has none."""
    train, evals = build_eval_loaders(cfg, rank, world, device)
    return train, next(iter(evals.values()), None)


def build_eval_loaders(cfg: Config, rank: int, world: int, device) -> tuple[Loader, dict[str, Loader]]:
    """(train, {split: eval loader}) for this rank, in `data.eval_splits`' order; a split the data lacks
    (no root/val) is left out."""
    d = cfg.data
    batch = cfg.rank_batch(world, rank)  # this rank's share of a micro-step (uneven where W does not divide it)
    eval_batch = cfg.data.eval_batch_per_rank or cfg.per_rank_batch(world)
    kind = resolve_loader(d.loader)
    if kind == "synthetic":
        # torch: the chosen loader's only (the login node imports this module: cli.bench → bench)
        from hpctrain.data.synthetic import SyntheticLoader

        if len(d.eval_splits) > 1:
            raise ConfigError(
                f"data.loader=synthetic has one eval set, not data.eval_splits={list(d.eval_splits)}: "
                "give one split, or a real dataset (data.root)"
            )
        common = dict(
            world=world,
            rank=rank,
            img_size=cfg.model.img_size,
            num_classes=cfg.model.num_classes,
            seed=cfg.train.seed,
            device=device,
        )
        return (
            SyntheticLoader(train=True, batch_size=batch, chunk=cfg.micro_batch, size=d.synthetic_size, **common),
            {
                d.eval_splits[0]: SyntheticLoader(
                    train=False, batch_size=eval_batch, size=max(1, d.synthetic_size // 10), **common
                )
            },
        )
    if not d.root:
        raise ConfigError("data.root is empty: point it at an ImageNet-layout folder (or use data.loader=synthetic)")
    aug = augment_spec(cfg)  # one spec for either loader: they cannot read a data.* option differently
    workers, why = resolve_workers(d.workers)  # auto: from this task's CPUs (data/workers.py)
    if rank == 0 and d.workers == "auto":
        log.info("loader workers: %s", why)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(d, workers=workers))
    d = cfg.data
    if kind == "dali":
        # DALI: optional (the torch loader runs without it)
        from hpctrain.data.dali import build_dali_loaders

        return build_dali_loaders(cfg, rank, world, device, batch, eval_batch, aug)
    if d.format != "folder":
        raise ConfigError(f"data.format={d.format!r} needs data.loader=dali (the torch loader reads folders)")
    # torch, PIL: the chosen loader's only (the login node imports this module: cli.bench → bench)
    from hpctrain.data.torch_loader import TorchLoader

    if cfg.aug.randaugment:
        raise ConfigError(
            f"aug.randaugment={cfg.aug.randaugment!r} needs the DALI loader (the torch loader has no "
            "RandAugment): set data.loader=dali, or clear aug.randaugment"
        )
    train_list, eval_lists = train_eval_listings(d.root, d.eval_splits, read_exclusions(d.exclude_file))
    mismatch = class_mismatch(train_list.root, len(train_list.classes), cfg.model.num_classes)
    if mismatch:
        raise ConfigError(mismatch)
    common = dict(
        rank=rank,
        world=world,
        seed=cfg.train.seed,
        workers=workers,
        device=device,
        aug=aug,
        skip_bad=d.on_bad_sample == "skip",
    )
    train = TorchLoader(
        train_list, train=True, batch_size=batch, chunk=cfg.micro_batch, repeats=cfg.aug.repeated_aug, **common
    )
    return train, {
        split: TorchLoader(lst, train=False, batch_size=eval_batch, **common) for split, lst in eval_lists.items()
    }

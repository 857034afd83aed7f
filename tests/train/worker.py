"""What every test worker does first, as `hpctrain train` does it (one task of `run_ranks`): join
the gloo group, seed, log like a rank, and build a CPU Trainer over the config's loaders."""

from __future__ import annotations

from pathlib import Path

import torch

from hpctrain.config import Config
from hpctrain.data.build import build_loaders
from hpctrain.models.vit import build_vit
from hpctrain.train import collective, dist
from hpctrain.train.dist import DistInfo
from hpctrain.train.entry import setup_logging
from hpctrain.train.loop import Trainer, build_trainer

CPU = torch.device("cpu")


def join(cfg: Config, timeout_s: int = 120) -> DistInfo:
    """This rank in the gloo group, seeded with the config's seed, logging as a rank does."""
    info = dist.detect()
    collective.init(info, "gloo", timeout_s)
    torch.manual_seed(cfg.train.seed)
    setup_logging(None, info.rank)
    return info


def cpu_trainer(cfg: Config, info: DistInfo, run_dir: Path | None, *args) -> Trainer:
    """A Trainer on the CPU over the config's loaders; `args` go on after the model (control, stop)."""
    train, val = build_loaders(cfg, info.rank, info.world_size, CPU)
    return build_trainer(cfg, info, CPU, run_dir, train, val, build_vit(cfg.model), *args)


def local(t: torch.Tensor) -> torch.Tensor:
    """A parameter's or gradient's own shard (a sharded one is a DTensor), else the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t

"""Test worker: train like `hpctrain train`, then save this rank's weights (rank-<r>.pt)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from hpctrain.config import load
from hpctrain.data.build import build_loaders
from hpctrain.models.vit import build_vit
from hpctrain.train import dist
from hpctrain.train.entry import setup_logging
from hpctrain.train.loop import Trainer


def main(config: str, out: str, *sets: str) -> None:
    cfg = load(config, list(sets))
    info = dist.detect()
    dist.init(info, "gloo", 120)
    torch.manual_seed(cfg.train.seed)
    setup_logging(None, info.rank)
    train, val = build_loaders(cfg, info.rank, info.world_size, torch.device("cpu"))
    trainer = Trainer(cfg, info, torch.device("cpu"), Path(out) if info.is_main else None, train, val,
                      build_vit(cfg.model))
    result = trainer.run()
    torch.save({"model": trainer.model.state_dict(), "eval": result.eval}, Path(out) / f"rank-{info.rank}.pt")
    dist.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])

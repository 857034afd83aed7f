"""Test worker: resume a run's newest checkpoint like `hpctrain train`, save what each rank holds
right after loading it (loaded-<r>.pt), then train on to the end."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from hpctrain.config import load
from hpctrain.data.build import build_loaders
from hpctrain.models.vit import build_vit
from hpctrain.train import checkpoint as ckpt
from hpctrain.train import dist
from hpctrain.train.entry import setup_logging
from hpctrain.train.loop import Trainer


def main(config: str, run_dir: str, *sets: str) -> None:
    cfg = load(config, list(sets))
    info = dist.detect()
    dist.init(info, "gloo", 120)
    torch.manual_seed(cfg.train.seed)
    setup_logging(None, info.rank)
    train, val = build_loaders(cfg, info.rank, info.world_size, torch.device("cpu"))
    trainer = Trainer(cfg, info, torch.device("cpu"), Path(run_dir), train, val, build_vit(cfg.model))
    resume = ckpt.find_resume(run_dir, "auto")
    trainer.load_state(resume[1], resume[0])
    torch.save({"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
                "ema": trainer.ema.state_dict() if trainer.ema else None, "step": trainer.step},
               Path(run_dir) / f"loaded-{info.rank}.pt")
    out = trainer.run(resume)
    print(f"rank {info.rank}: {out.status} at step {out.step} from {out.resumed_from}, loss {out.train_loss}")
    dist.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])

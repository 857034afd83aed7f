"""Test worker: train like `hpctrain train` and save this rank's weights before and after, and its loss
weight (step-<r>.pt): what tests/train/test_uneven_split.py compares across world sizes."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from hpctrain.config import load
from hpctrain.train import collective
from tests.train.worker import cpu_trainer, join


def main(config: str, out: str, *sets: str) -> None:
    cfg = load(config, list(sets))
    info = join(cfg)
    trainer = cpu_trainer(cfg, info, Path(out) if info.is_main else None)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.run()
    after = trainer.model.state_dict()
    torch.save(
        {"before": before, "after": after, "loss_weight": trainer.loss_weight}, Path(out) / f"step-{info.rank}.pt"
    )
    collective.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Test worker: train like `hpctrain train`, then save this rank's weights (rank-<r>.pt)."""

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
    result = trainer.run()
    torch.save({"model": trainer.model.state_dict(), "eval": result.eval}, Path(out) / f"rank-{info.rank}.pt")
    collective.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])

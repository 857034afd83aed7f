"""Test worker: a rank that trains the digits config twice in one process group, with gradients
all-reduced in fp32 and then in bf16 (dist.grad_reduce_dtype), as `hpctrain train` does.

Rank 0 writes result.json: per dtype, the final eval, the last logged loss and the bytes reduced
per step (tests/train/test_comm.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from hpctrain.config import load
from hpctrain.data.build import build_loaders
from hpctrain.models.vit import build_vit
from hpctrain.train import collective, dist
from hpctrain.train.entry import setup_logging
from hpctrain.train.loop import build_trainer
from tests.helpers import DIGITS, run_metrics


def main(root: str, out: str, *sets: str) -> None:
    info = dist.detect()
    collective.init(info, "gloo", 120)
    setup_logging(None, info.rank)
    result = {}
    for dtype in ("fp32", "bf16"):
        run_dir = Path(out) / dtype
        cfg = load(
            DIGITS,
            [
                f"data.root={root}",
                "train.threads=1",
                "train.eval_every_epochs=0",
                "ckpt.every=0",
                f"dist.grad_reduce_dtype={dtype}",
                *sets,
            ],
        )
        torch.manual_seed(cfg.train.seed)
        train, val = build_loaders(cfg, info.rank, info.world_size, torch.device("cpu"))
        if info.is_main:
            run_dir.mkdir(parents=True)
        trainer = build_trainer(
            cfg, info, torch.device("cpu"), run_dir if info.is_main else None, train, val, build_vit(cfg.model)
        )
        outcome = trainer.run()
        trainer.metrics.close()
        if info.is_main:
            result[dtype] = {
                "top1": outcome.eval["top1"],
                "loss": outcome.train_loss,
                "step": outcome.step,
                "bytes": sorted({r["grad_reduce_bytes"] for r in run_metrics(run_dir, "train")}),
                "params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
            }
    if info.is_main:
        Path(out, "result.json").write_text(json.dumps(result))
    collective.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])

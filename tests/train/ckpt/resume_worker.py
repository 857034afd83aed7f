"""Test worker: resume a run's newest checkpoint like `hpctrain train`, save what each rank holds
right after loading it (loaded-<r>.pt), then train on to the end."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from hpctrain.config import load
from hpctrain.train import collective
from hpctrain.train.ckpt import checkpoint as ckpt
from tests.train.worker import cpu_trainer, join


def main(config: str, run_dir: str, *sets: str) -> None:
    cfg = load(config, list(sets))
    info = join(cfg)
    trainer = cpu_trainer(cfg, info, Path(run_dir))
    resume = ckpt.find_resume(run_dir, "auto")
    trainer.load_state(resume[1], resume[0])
    torch.save(
        {
            "model": trainer.model.state_dict(),
            "optimizer": trainer.optimizer.state_dict(),
            "ema": trainer.ema.state_dict() if trainer.ema else None,
            "step": trainer.step,
        },
        Path(run_dir) / f"loaded-{info.rank}.pt",
    )
    out = trainer.run(resume)
    print(f"rank {info.rank}: {out.status} at step {out.step} from {out.resumed_from}, loss {out.train_loss}")
    collective.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Test worker: a rank of FSDP2 training with train.amp=bf16 on the digits config, in-process,
recording the dtypes a block's linear layer sees inside forward and those the optimizer steps on.

Writes result-<rank>.json (tests/train/test_fsdp.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from hpctrain.config import load
from hpctrain.train import collective
from tests.helpers import DIGITS
from tests.train.worker import cpu_trainer, join, local


def main(root: str, out: str, *sets: str) -> None:
    cfg = load(
        DIGITS,
        [
            f"data.root={root}",
            "train.threads=1",
            "log.every=1",
            "train.eval_every_epochs=0",
            "ckpt.every=0",
            "dist.parallel=fsdp",
            "train.amp=bf16",
            "train.max_steps=30",
            *sets,
        ],
    )
    info = join(cfg, 60)
    trainer = cpu_trainer(cfg, info, None)
    seen: dict[str, set] = {"weight": set(), "input": set(), "output": set(), "grad": set(), "param": set()}
    fc = trainer.model.blocks[0].mlp.fc1

    def in_forward(module, args, output):
        seen["weight"].add(str(module.weight.dtype))
        seen["input"].add(str(args[0].dtype))
        seen["output"].add(str(output.dtype))

    fc.register_forward_hook(in_forward)
    opt_step = trainer.optimizer.step

    def step(*a, **kw):
        for g in trainer.optimizer.param_groups:
            for p in g["params"]:
                seen["param"].add(str(local(p).dtype))
                seen["grad"].add(str(local(p.grad).dtype))
        return opt_step(*a, **kw)

    trainer.optimizer.step = step
    losses = []
    step_fn = trainer.train_step
    trainer.train_step = lambda batches: losses.append(float(step_fn(batches))) or torch.tensor(losses[-1])
    result = trainer.run()
    Path(out, f"result-{info.rank}.json").write_text(
        json.dumps(
            {
                "seen": {k: sorted(v) for k, v in seen.items()},
                "losses": losses,
                "status": result.status,
                "top1": result.eval.get("top1"),
                "sharded": [str(local(p).dtype) for p in trainer.model.parameters()],
            }
        )
    )
    collective.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Test worker: a rank of FSDP2 training with train.amp=fp16 on the digits config, in-process; rank 1
puts an inf into its own shard of one gradient before the loss scaler unscales, and every rank
records whether its step was skipped and its scale after (tests/train/test_fsdp.py).

`no-dtensor-agreement`: DTensor's own MAX-reduction of found_inf (torch >= 2.5's dispatcher handler
for `_amp_foreach_non_finite_check_and_unscale_`) is taken out, as on a torch without it.

Writes result-<rank>.json.
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


def drop_dtensor_agreement() -> None:
    from torch.distributed.tensor import DTensor  # FSDP runs only (torch >= 2.4)

    op = torch.ops.aten._amp_foreach_non_finite_check_and_unscale_.default
    DTensor._op_dispatcher._custom_op_handlers.pop(op, None)


def main(root: str, out: str, mode: str) -> None:
    if mode == "no-dtensor-agreement":
        drop_dtensor_agreement()
    cfg = load(
        DIGITS,
        [
            f"data.root={root}",
            "train.threads=1",
            "log.every=1",
            "train.eval_every_epochs=0",
            "ckpt.every=0",
            "dist.parallel=fsdp",
            "train.amp=fp16",
            "train.max_steps=2",
            "model.depth=1",
            "optim.warmup_steps=0",
        ],
    )
    info = join(cfg, 60)
    trainer = cpu_trainer(cfg, info, None)
    scaler = trainer.scaler
    params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    target = max(params, key=lambda p: local(p).numel())  # a shard with elements on every rank
    unscale = scaler.unscale_

    def inject_then_unscale(optimizer):
        if info.rank == 1:
            local(target.grad).view(-1)[0] = float("inf")
        return unscale(optimizer)

    scaler.unscale_ = inject_then_unscale
    before = [local(p).detach().clone() for p in params]
    scale0 = scaler.get_scale()
    trainer.train_step([next(iter(trainer.train_loader))])
    skipped = all(torch.equal(b, local(p).detach()) for b, p in zip(before, params))
    Path(out, f"result-{info.rank}.json").write_text(
        json.dumps({"scaler": type(scaler).__name__, "scale0": scale0, "scale": scaler.get_scale(), "skipped": skipped})
    )
    trainer.close()
    collective.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Test worker: a rank of `hpctrain train` on the digits config, in-process, with two probes at
step boundaries (tests/train/test_stop_agreement.py):

- ckpt.every=3: a save runs while a stop round is in flight;
- at boundary OVERLAP, rank 1 does not post its stop bits until rank 0 has begun the next step:
  a blocking agreement deadlocks here (rank 0 would wait for rank 1, which waits for rank 0);
- while step SIGNAL+1 runs, rank 1 sends itself SIGUSR2 (a real signal, the real handler).

Writes result-<rank>.json: the outcome and the steps at which rank 0 began a step.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
from pathlib import Path

import torch.distributed as td

from hpctrain.config import load
from hpctrain.train import collective, stop
from hpctrain.train.stop_rounds import StopRounds
from tests.helpers import DIGITS
from tests.train.worker import cpu_trainer, join

OVERLAP, SIGNAL = 2, 4


def main(root: str, out: str) -> None:
    sets = [
        f"data.root={root}",
        f"run.dir={out}",
        "run.name=run",
        "train.threads=1",
        "log.every=1",
        "train.eval_every_epochs=0",
        "ckpt.every=3",
        "train.max_steps=12",
    ]
    cfg = load(DIGITS, sets)
    flag = stop.install()
    info = join(cfg, 60)
    run_dir = Path(out) / "run"
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    store = td.distributed_c10d._get_default_store()
    began = []

    class LateRank1(StopRounds):
        """The stop policy, with rank 1 late to read its round at boundary OVERLAP."""

        def at_boundary(self, step: int, total: int, halt_at: int, exclude: bool) -> int:
            if info.rank == 1 and step == OVERLAP:
                store.wait(["rank0_began_next_step"], datetime.timedelta(seconds=30))
            return super().at_boundary(step, total, halt_at, exclude)

    trainer = cpu_trainer(cfg, info, run_dir if info.is_main else None, None, flag, LateRank1(flag, None))
    step_fn = trainer.train_step

    def train_step(batches):
        began.append(trainer.step)
        if info.rank == 0 and trainer.step == OVERLAP:
            store.set("rank0_began_next_step", "1")
        if info.rank == 1 and trainer.step == SIGNAL:
            os.kill(os.getpid(), signal.SIGUSR2)
        return step_fn(batches)

    trainer.train_step = train_step
    result = trainer.run()
    Path(out, f"result-{info.rank}.json").write_text(
        json.dumps({"status": result.status, "step": result.step, "stop_kind": result.stop_kind, "began": began})
    )
    collective.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Test worker: a compiled DDP (or FSDP) run whose rank $SLOW_COMPILE_RANK compiles slowly, then this rank's
weights (rank-<r>.pt). The delay wraps Inductor's entry point (what torch.compile's default backend
calls for every graph), so it slows the first compile wherever that happens: in the warm-up
(compile.warmup) or, without it, inside DDP's first step."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch._inductor.compile_fx as inductor_entry

from hpctrain.config import load
from hpctrain.train import collective
from tests.train.worker import cpu_trainer, join, local


def slow_first_compile(seconds: float) -> None:
    """Sleep `seconds` in this process's first Inductor compile."""
    inner = inductor_entry.compile_fx
    slept = []

    def compile_fx(*args, **kwargs):
        if not slept:
            slept.append(True)
            time.sleep(seconds)
        return inner(*args, **kwargs)

    inductor_entry.compile_fx = compile_fx


def main(config: str, out: str, *sets: str) -> None:
    cfg = load(config, list(sets))
    if os.environ.get("SLOW_COMPILE_RANK") == os.environ["RANK"]:
        slow_first_compile(float(os.environ["SLOW_COMPILE_S"]))
    info = join(cfg, cfg.dist.pg_timeout_s)
    trainer = cpu_trainer(cfg, info, Path(out) if info.is_main else None)
    trainer.run()
    state = {k: local(v) for k, v in trainer.model.state_dict().items()}  # FSDP: this rank's shards
    torch.save(state, Path(out) / f"rank-{info.rank}.pt")
    collective.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])

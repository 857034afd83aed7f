"""A rank for tests/train/test_peer_failure.py: rank 1 stops (SIGSTOP) or dies after the first
collective; rank 0 runs a collective the way `mode` says, then prints what `diagnose` makes of the
error gloo raised (`ended`: rank 1 dies, and rank 0 gets a SIGTERM, as srun --kill-on-bad-exit sends,
before it diagnoses, and waits up to 60 s for the silent rank). Run with torchrun-style variables
(tests.helpers); argv: mode, stop|die|ended, timeout_s."""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as td
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from hpctrain.train import stop as stopmod
from hpctrain.train.collective import diagnose, peer_failure


def main(mode: str, fate: str, timeout_s: float) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    stopmod.install()  # a task's handlers: SIGTERM is recorded, not fatal
    td.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    if mode == "ddp-hook":  # train/comm.py's CountingHook wraps this hook
        model.register_comm_hook(None, default_hooks.allreduce_hook)
    td.barrier()
    if rank == 1:
        print("stopping", flush=True)
        if fate in ("die", "ended"):
            os._exit(9)
        os.kill(os.getpid(), signal.SIGSTOP)
    try:
        for _ in range(1000):  # the first collective may still find rank 1's data in flight
            if mode == "all-reduce":
                td.all_reduce(torch.ones(1 << 16))
            else:
                model(torch.randn(8, 64)).sum().backward()
    except Exception as e:  # noqa: BLE001 - what gloo raised, whatever its type
        print(f"peer failure: {peer_failure(e)}", flush=True)
        if fate == "ended":
            os.kill(os.getpid(), signal.SIGTERM)
        t = time.monotonic()
        print(f"diagnosis: {diagnose(e, rank, world, wait_s=60.0 if fate == 'ended' else 5.0)}", flush=True)
        print(f"diagnosed in {time.monotonic() - t:.1f} s", flush=True)
        os._exit(1)  # the group is unusable: no orderly shutdown
    print("no error", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))

"""Faults injected on purpose, for the fault tests: a NaN loss at a step, a slow rank, a crash, a
GPU that fails.

A policy object the Trainer is given (read from the environment when none is: the tests set
HPCTRAIN_TEST_NAN, HPCTRAIN_TEST_DELAY, HPCTRAIN_TEST_CRASH and HPCTRAIN_TEST_GPU_FAULT on the ranks
they start), so the loop has no test-only branches of its own: it calls these at the points a real
fault would strike.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from hpctrain.run.badnodes import this_node
from hpctrain.train.health.guard import injected_nan
from hpctrain.train.health.straggler import injected_delay

CRASH_ENV = "HPCTRAIN_TEST_CRASH"
# A file of node names: a rank on a node named there fails its next step with a CUDA hardware
# error, as after an Xid (tests/launch/test_spares.py; the fake nvidia-smi reads the same file).
GPU_FAULT_ENV = "HPCTRAIN_TEST_GPU_FAULT"


def injected_crash(rank: int, env=None) -> int:
    """HPCTRAIN_TEST_CRASH="rank:step": that rank raises in the step that ends at `step`, in every
    attempt (tests/faults/test_rank_crash.py); 0 otherwise."""
    spec = (os.environ if env is None else env).get(CRASH_ENV, "")
    if not spec:
        return 0
    try:
        r, step = (int(x) for x in spec.split(":"))
    except ValueError:
        raise ValueError(f"{CRASH_ENV}={spec!r}: expected rank:step") from None
    return step if r == rank and step >= 1 else 0


def _names(path: str) -> list[str]:
    try:
        return Path(path).read_text().split()
    except OSError:
        return []


@dataclass
class Faults:
    """None by default. `nan_at` is cleared once fired unless `nan_always` (once per process)."""

    nan_at: int = 0  # the optimizer step (the one that ends there) whose loss is made NaN
    nan_always: bool = False
    data_delay: float = 0.0  # seconds added to each step's data wait
    compute_delay: float = 0.0  # seconds added to each forward (straggler.Clock)
    crash_at: int = 0  # the optimizer step whose forward raises (a bug that strikes there every time)
    gpu_fault: str = ""  # a file naming the nodes whose GPU fails (GPU_FAULT_ENV)

    @classmethod
    def from_env(cls, rank: int, env=None) -> Faults:
        """This rank's faults per HPCTRAIN_TEST_NAN and HPCTRAIN_TEST_DELAY (guard, straggler)."""
        nan_at, always = injected_nan(rank, env)
        delay, where = injected_delay(rank, env)
        data, compute = (delay if where == "data" else 0.0), (delay if where == "compute" else 0.0)
        gpu_fault = (os.environ if env is None else env).get(GPU_FAULT_ENV, "")
        return cls(nan_at, always, data, compute, injected_crash(rank, env), gpu_fault)

    def loss(self, loss: torch.Tensor, step: int, micro: int) -> torch.Tensor:
        """The loss of micro-batch `micro` of the step after `step`, NaN where one is injected."""
        if self.crash_at == step + 1:
            raise RuntimeError(f"injected crash at step {step + 1} ({CRASH_ENV})")
        if self.gpu_fault and micro == 0 and this_node() in _names(self.gpu_fault):
            raise RuntimeError(f"CUDA error: uncorrectable ECC error encountered (injected: {GPU_FAULT_ENV})")
        if self.nan_at == step + 1 and micro == 0:
            loss = loss * float("nan")
            self.nan_at = self.nan_at if self.nan_always else 0
        return loss

    def data_wait(self) -> None:
        """After a step's batches arrive: a slow data path (counted in the data wait)."""
        if self.data_delay:
            time.sleep(self.data_delay)

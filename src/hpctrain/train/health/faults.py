"""Faults injected on purpose, for the fault tests: a NaN loss at a step, a slow rank, a crash, an
out-of-memory kill, a GPU that fails.

A policy object the Trainer is given (read from the environment when none is: the tests set
HPCTRAIN_TEST_NAN, HPCTRAIN_TEST_DELAY, HPCTRAIN_TEST_CRASH, HPCTRAIN_TEST_OOM and
HPCTRAIN_TEST_GPU_FAULT on the ranks they start), so the loop has no test-only branches of its own:
it calls these at the points a real fault would strike.
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
OOM_ENV = "HPCTRAIN_TEST_OOM"
# bytes touched at a time, the pause after each (160 MiB/s: Slurm samples a task's memory every second
# or more, and a cgroup near its limit with the file cache of torch's libraries in it kills a few hundred
# MiB on; a fill spread over seconds is seen growing, so sacct's MaxRSS names this rank), the most
# before giving up
OOM_CHUNK, OOM_PAUSE_S, OOM_CAP = 16 << 20, 0.1, 8 << 30


def injected_crash(rank: int, env=None) -> int:
    """HPCTRAIN_TEST_CRASH="rank:step": that rank raises in the step that ends at `step`, in every
    attempt (tests/faults/test_rank_crash.py); 0 otherwise."""
    return _rank_step(CRASH_ENV, rank, env)


def injected_oom(rank: int, env=None) -> int:
    """HPCTRAIN_TEST_OOM="rank:step": that rank fills memory in the step that ends at `step`, in every
    attempt, until the kernel kills it (a cgroup OOM kill under the job's --mem:
    tests/faults/test_oom.py); 0 otherwise."""
    return _rank_step(OOM_ENV, rank, env)


def _rank_step(name: str, rank: int, env=None) -> int:
    spec = (os.environ if env is None else env).get(name, "")
    if not spec:
        return 0
    try:
        r, step = (int(x) for x in spec.split(":"))
    except ValueError:
        raise ValueError(f"{name}={spec!r}: expected rank:step") from None
    return step if r == rank and step >= 1 else 0


def _names(path: str) -> list[str]:
    try:
        return Path(path).read_text().split()
    except OSError:
        return []


def exhaust_memory(chunk: int = OOM_CHUNK, pause_s: float = OOM_PAUSE_S, cap: int = OOM_CAP) -> None:
    """Touch `chunk` bytes at a time until the kernel kills this process; past `cap` bytes raise
    instead, so that a machine without a memory limit fails the test, not itself."""
    hog: list[bytearray] = []
    while len(hog) * chunk < cap:
        hog.append(bytearray(b"\1") * chunk)  # written, so resident (a bare allocation may not be)
        time.sleep(pause_s)
    raise RuntimeError(f"{OOM_ENV}: {cap >> 20} MiB allocated and not killed: no memory limit on this process")


@dataclass
class Faults:
    """None by default. `nan_at` is cleared once fired unless `nan_always` (once per process)."""

    nan_at: int = 0  # the optimizer step (the one that ends there) whose loss is made NaN
    nan_always: bool = False
    data_delay: float = 0.0  # seconds added to each step's data wait
    compute_delay: float = 0.0  # seconds added to each forward (straggler.Clock)
    crash_at: int = 0  # the optimizer step whose forward raises (a bug that strikes there every time)
    oom_at: int = 0  # the optimizer step whose forward fills memory until the process is killed
    gpu_fault: str = ""  # a file naming the nodes whose GPU fails (GPU_FAULT_ENV)

    @classmethod
    def from_env(cls, rank: int, env=None) -> Faults:
        """This rank's faults per HPCTRAIN_TEST_NAN and HPCTRAIN_TEST_DELAY (guard, straggler),
        HPCTRAIN_TEST_CRASH and HPCTRAIN_TEST_OOM."""
        nan_at, always = injected_nan(rank, env)
        delay, where = injected_delay(rank, env)
        data, compute = (delay if where == "data" else 0.0), (delay if where == "compute" else 0.0)
        gpu_fault = (os.environ if env is None else env).get(GPU_FAULT_ENV, "")
        return cls(nan_at, always, data, compute, injected_crash(rank, env), injected_oom(rank, env), gpu_fault)

    def loss(self, loss: torch.Tensor, step: int, micro: int) -> torch.Tensor:
        """The loss of micro-batch `micro` of the step after `step`, NaN where one is injected."""
        if self.crash_at == step + 1:
            raise RuntimeError(f"injected crash at step {step + 1} ({CRASH_ENV})")
        if self.gpu_fault and micro == 0 and this_node() in _names(self.gpu_fault):
            raise RuntimeError(f"CUDA error: uncorrectable ECC error encountered (injected: {GPU_FAULT_ENV})")
        if self.oom_at == step + 1:
            exhaust_memory()
        if self.nan_at == step + 1 and micro == 0:
            loss = loss * float("nan")
            self.nan_at = self.nan_at if self.nan_always else 0
        return loss

    def data_wait(self) -> None:
        """After a step's batches arrive: a slow data path (counted in the data wait)."""
        if self.data_delay:
            time.sleep(self.data_delay)

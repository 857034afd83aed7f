"""Faults injected on purpose, for the fault tests: a NaN loss at a step, a slow rank.

A policy object the Trainer is given (read from the environment when none is: the tests set
HPCTRAIN_TEST_NAN and HPCTRAIN_TEST_DELAY on the ranks they start), so the loop has no test-only
branches of its own: it calls these at the points a real fault would strike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from hpctrain.train.health.guard import injected_nan
from hpctrain.train.health.straggler import injected_delay


@dataclass
class Faults:
    """None by default. `nan_at` is cleared once fired unless `nan_always` (once per process)."""

    nan_at: int = 0  # the optimizer step (the one that ends there) whose loss is made NaN
    nan_always: bool = False
    data_delay: float = 0.0  # seconds added to each step's data wait
    compute_delay: float = 0.0  # seconds added to each forward (straggler.Clock)

    @classmethod
    def from_env(cls, rank: int, env=None) -> Faults:
        """This rank's faults per HPCTRAIN_TEST_NAN and HPCTRAIN_TEST_DELAY (guard, straggler)."""
        nan_at, always = injected_nan(rank, env)
        delay, where = injected_delay(rank, env)
        return cls(nan_at, always, delay if where == "data" else 0.0, delay if where == "compute" else 0.0)

    def loss(self, loss: torch.Tensor, step: int, micro: int) -> torch.Tensor:
        """The loss of micro-batch `micro` of the step after `step`, NaN where one is injected."""
        if self.nan_at == step + 1 and micro == 0:
            loss = loss * float("nan")
            self.nan_at = self.nan_at if self.nan_always else 0
        return loss

    def data_wait(self) -> None:
        """After a step's batches arrive: a slow data path (counted in the data wait)."""
        if self.data_delay:
            time.sleep(self.data_delay)

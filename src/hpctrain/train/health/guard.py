"""Non-finite values and loss spikes: detected without a host sync, acted on by every rank alike.

Every step ORs "the loss (or the gradient norm) is not finite" into a boolean on the device
(`FiniteFlag.update`: an isfinite and a logical or, no `.item()`), so nothing waits on the GPU.
The flag is read where the loop syncs anyway: at the log boundary it travels in the loss's
all-reduce (one more element), and before every checkpoint it is all-reduced with the weights'
own finiteness, so no checkpoint is written from a state that saw a non-finite value. A spike is
judged on the agreed logged loss (`SpikeWatch`): the same number on every rank, so no collective.
What follows (rollback or stop) is `rollback.restore` in train/health/rollback.py.
"""

from __future__ import annotations

import os
import statistics
from collections import deque
from enum import Enum

import torch

TEST_NAN_ENV = "HPCTRAIN_TEST_NAN"


class Reason(Enum):
    """Why the loop raised `Diverged`. The value is the name metrics.jsonl's `nonfinite` and
    `rollback` records and the log give it (`hpctrain status` shows it as written)."""

    NONFINITE = "nonfinite"  # a loss or gradient norm (or, before a save, a weight) that is NaN or infinite
    SPIKE = "spike"  # the agreed logged loss above health.spike_factor times the recent median

    @property
    def what(self) -> str:
        """The event in words, for the error that stops the run."""
        return "a non-finite loss or gradient norm" if self is Reason.NONFINITE else "a loss spike"


class Diverged(Exception):
    """Raised inside the loop on every rank at once (an agreed value): roll back or stop."""

    def __init__(self, step: int, reason: Reason, detail: dict):
        super().__init__(f"{reason.value} at step {step}")
        self.step, self.reason, self.detail = step, reason, detail


class FiniteFlag:
    """A device boolean: some value since the last `clear` was NaN or infinite."""

    def __init__(self, device: torch.device):
        self.bad = torch.zeros((), dtype=torch.bool, device=device)

    def update(self, value: torch.Tensor) -> None:
        """OR in `~isfinite(value)` (a scalar on the device; no sync)."""
        torch.logical_or(self.bad, ~torch.isfinite(value), out=self.bad)

    def clear(self) -> None:
        self.bad.zero_()


def params_finite(model: torch.nn.Module) -> torch.Tensor:
    """A device boolean: every parameter (this rank's shard under FSDP) is finite. Read before a
    save: a NaN gradient that left the loss finite still reaches the weights."""
    ok = [torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all() for p in model.parameters()]
    return torch.stack(ok).all() if ok else torch.ones((), dtype=torch.bool)


class SpikeWatch:
    """A logged loss above `factor` × the median of the last `window` logged ones is a spike (off at 0)."""

    def __init__(self, factor: float, window: int):
        self.factor = factor
        self.history: deque[float] = deque(maxlen=window)

    def check(self, loss: float) -> float | None:
        """The median `loss` exceeded `factor` times (a spike), else None; a clean loss joins the window."""
        if self.factor > 0 and len(self.history) >= 3:
            median = statistics.median(self.history)
            if loss > self.factor * median:
                return median
        self.history.append(loss)
        return None

    def reset(self) -> None:
        self.history.clear()


def injected_nan(rank: int, env=None) -> tuple[int, bool]:
    """Test-only hook: HPCTRAIN_TEST_NAN="rank:step[:always]" makes that rank's loss NaN at optimizer
    step `step` (the step that ends there), once per process unless `always`; (0, False) otherwise."""
    spec = (os.environ if env is None else env).get(TEST_NAN_ENV, "")
    if not spec:
        return 0, False
    try:
        r, step, *rest = spec.split(":")
        if rest not in ([], ["always"]) or int(step) < 1:
            raise ValueError(spec)
        return (int(step), bool(rest)) if int(r) == rank else (0, False)
    except ValueError:
        raise ValueError(f"{TEST_NAN_ENV}={spec!r}: expected rank:step or rank:step:always") from None

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

import math
import os
import statistics
from collections import deque
from enum import Enum

import torch
import torch.distributed as td

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


class Guard:
    """The loop's health checks, read where it syncs anyway: `check` at a log boundary (the window's
    loss, gradient norm and the non-finite flag in one all-reduce; a spike of the agreed loss),
    `healthy` before a save and at the end. Raises or answers alike on every rank."""

    def __init__(self, device: torch.device, spike_factor: float, spike_window: int, world_size: int):
        self.finite = FiniteFlag(device)  # OR of "not finite" since the last clean check, on the device
        self.spikes = SpikeWatch(spike_factor, spike_window)
        self.world_size = world_size

    def healthy(self, model: torch.nn.Module | None = None) -> bool:
        """Every rank agrees that no loss or gradient norm since the last check was non-finite (and,
        given `model`, no parameter is): one all-reduce of a flag."""
        bad = self.finite.bad
        if model is not None:
            bad = bad | ~params_finite(model)
        flag = bad.to(torch.int32).reshape(1)
        if td.is_initialized() and self.world_size > 1:  # a world of one (FSDP on one GPU): nothing to reduce
            td.all_reduce(flag, op=td.ReduceOp.MAX)
        return not bool(flag.item())

    def check(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> tuple[float, float]:
        """The log boundary's one sync: (mean loss over every rank, mean gradient norm) of the window;
        Diverged on a non-finite value anywhere since the last check, or on a spike of the agreed loss
        (health.spike_factor)."""
        v = torch.stack([loss.float(), grad_norm.float(), self.finite.bad.float()])
        if td.is_initialized() and self.world_size > 1:
            td.all_reduce(v)
            v[:2] /= self.world_size
        mean, gn, bad = v.tolist()
        if bad or not math.isfinite(mean):
            raise Diverged(step, Reason.NONFINITE, {"loss": mean, "grad_norm": gn})
        median = self.spikes.check(mean)
        if median is not None:
            raise Diverged(step, Reason.SPIKE, {"loss": mean, "median": median, "factor": self.spikes.factor})
        return mean, gn


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

"""`ckpt.every: auto`: the checkpoint interval from its measured cost (Young 1974 / Daly 2006).

A checkpoint every τ seconds of training costs δ (the save) per τ, and an interruption loses on
average τ/2 of training; the sum per unit of time, δ/τ + τ/(2M) for a mean time between
interruptions M, is least at τ = √(2δM) (Young's first-order optimum; Daly's higher-order
estimate is 2 % shorter at δ = M/600, a minute's save and a 10-hour MTBF: docs/checkpoints.md). Here δ is the time
training waited for this run's own save, measured at a first checkpoint at a small fixed step
(`ckpt.auto_first`) and at every save after it, M is the job's MTBF (`ckpt.mtbf_h`, which
`hpctrain submit` resolves from the partition's sacct history or the profile: a task has no Slurm
client), and τ becomes steps through the measured step time. Torch-free: plain arithmetic.

The task applies it (train.ckpt.cadence); `hpctrain submit` prices it (plan.ckpt_cost): it lives below both.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_MTBF_H = 24.0  # a job's MTBF when nothing says better (a local run, a stand-alone script)
MTBF_SOURCE_ENV = "HPCTRAIN_MTBF_SOURCE"  # where `hpctrain submit` found ckpt.mtbf_h: provenance, not a setting
RECOMPUTE_FACTOR = 1.5  # a save this many times slower or faster than the one the interval used: recompute


def mtbf_source(mtbf_h: float, env: Mapping[str, str] | None = None) -> str:
    """Where the job's MTBF came from, for env.json and the ckpt_interval record: what `hpctrain
    submit` exported beside the batch script's other facts, else the config or the default."""
    env = os.environ if env is None else env
    return env.get(MTBF_SOURCE_ENV) or ("ckpt.mtbf_h" if mtbf_h else "default")


def young_daly_s(save_s: float, mtbf_s: float) -> float:
    """The optimal compute time between checkpoints, √(2 × save time × MTBF) (Young 1974, Daly 2006)."""
    if save_s < 0 or mtbf_s <= 0:
        raise ValueError(f"save time {save_s} s and MTBF {mtbf_s} s: need save >= 0 and MTBF > 0")
    return math.sqrt(2.0 * save_s * mtbf_s)


def interval_steps(save_s: float, step_s: float, mtbf_s: float) -> int:
    """Young/Daly's interval in optimizer steps of `step_s` seconds (at least 1)."""
    if step_s <= 0:
        raise ValueError(f"step time {step_s} s: must be > 0")
    return max(1, round(young_daly_s(save_s, mtbf_s) / step_s))


@dataclass
class StepClock:
    """Training seconds per optimizer step, from the log windows (each ends in the log boundary's
    sync, so host time there is device time) less the saves inside them. The first window of an
    attempt holds the start-up (DDP bucket rebuild, compile, cold caches) and is left out once
    another one exists."""

    first: tuple[int, float] | None = None
    steps: int = 0
    seconds: float = 0.0

    def add(self, steps: int, seconds: float) -> None:
        if self.first is None:
            self.first = (steps, seconds)
        else:
            self.steps += steps
            self.seconds += seconds

    def step_s(self) -> float | None:
        if self.steps:
            return self.seconds / self.steps
        if self.first and self.first[0]:
            return self.first[1] / self.first[0]
        return None

    def reset(self) -> None:
        self.first, self.steps, self.seconds = None, 0, 0.0


@dataclass
class AutoInterval:
    """When the next `ckpt.every: auto` checkpoint is due, and why (one instance per attempt).

    The first save comes `first` steps after the attempt starts; each periodic save reports its
    measured save time and the step time, and the interval is (re)computed after the first one and
    whenever the save time moves by more than RECOMPUTE_FACTOR from the one it was computed with.
    Every rank must pass the same values (the trainer agrees on the largest), so all save alike."""

    first: int
    mtbf_h: float
    mtbf_source: str
    next_step: int = 0
    steps: int = 0  # the interval in use (0: not measured yet)
    save_s: float = 0.0  # the save time it was computed from

    def start(self, step: int) -> None:
        """Training (re)starts at `step`: the first save `first` steps on, or one interval once measured."""
        self.next_step = step + (self.steps or self.first)

    def due(self, step: int) -> bool:
        return step >= self.next_step

    def saved(self, step: int, save_s: float, step_s: float) -> dict | None:
        """A periodic save at `step` took `save_s`: the next due step; the new interval's record
        (the `ckpt_interval` metrics fields) when it was (re)computed, else None."""
        changed = not self.steps or save_s > RECOMPUTE_FACTOR * self.save_s or save_s * RECOMPUTE_FACTOR < self.save_s
        if changed:
            before = self.steps
            self.steps = interval_steps(save_s, step_s, self.mtbf_h * 3600.0)
            self.save_s = save_s
        self.next_step = step + self.steps
        if not changed:
            return None
        interval = young_daly_s(save_s, self.mtbf_h * 3600.0)
        return {
            "interval_steps": self.steps,
            "interval_s": interval,
            "save_s": save_s,
            "step_s": step_s,
            "mtbf_h": self.mtbf_h,
            "mtbf_source": self.mtbf_source,
            "next_step": self.next_step,
            "previous_steps": before or None,
            "formula": "sqrt(2 * save_s * mtbf_s) (Young 1974, Daly 2006)",
        }

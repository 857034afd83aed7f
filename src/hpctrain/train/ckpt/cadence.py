"""When a periodic checkpoint is due, and the step clock that `ckpt.every: auto` reads.

`ckpt.every` is a step count, or `auto`: Young/Daly's interval from the measured save and step
times (hpctrain.ckpt_interval, torch-free arithmetic). The step clock counts training time only:
the seconds of saves and evals inside a log window are paused out of it. Every rank must save at the
same steps, so the interval is computed from the slowest rank's times (one small all-reduce on the
control group, after a periodic save, where the ranks wait for each other anyway).
"""

from __future__ import annotations

import logging
import time

from hpctrain import ckpt_interval as interval
from hpctrain.config.schema import CkptConfig
from hpctrain.run.metrics import MetricsWriter
from hpctrain.train.collective import agree_max

log = logging.getLogger("hpctrain")


class Cadence:
    """The save schedule of one attempt: `due(step)`, and what the loop tells it (a (re)start, a
    log window's training time, a save's or an eval's seconds)."""

    def __init__(self, cfg: CkptConfig, metrics: MetricsWriter, control_group=None, is_main: bool = True):
        self.every = cfg.every if isinstance(cfg.every, int) else 0  # steps between saves (0: off, or auto)
        self.metrics, self.control_group, self.is_main = metrics, control_group, is_main
        self.auto = (
            interval.AutoInterval(
                cfg.auto_first, cfg.mtbf_h or interval.DEFAULT_MTBF_H, interval.mtbf_source(cfg.mtbf_h)
            )
            if cfg.every == "auto"
            else None
        )
        self.clock = interval.StepClock()  # training seconds per step (saves and evals left out)
        self.paused_s = 0.0  # seconds of saves and evals in the current log window
        self.ckpt_s = self.eval_s = 0.0  # the same, split: blocking saves, evals (the goodput ledger's)
        self.started = (0, time.perf_counter())  # (step, time) training last (re)started at

    def restart(self, step: int) -> None:
        """Training (re)starts at `step` (a start, a resume, a rollback): the step time is measured
        anew, and auto's next save comes ckpt.auto_first steps on (or one interval on, once measured)."""
        self.clock.reset()
        self.paused_s = 0.0
        self.started = (step, time.perf_counter())
        if self.auto:
            self.auto.start(step)

    def due(self, step: int) -> bool:
        """A periodic checkpoint is due at `step` (the loop asks before its last step only: the end
        saves its own)."""
        if self.auto:
            return self.auto.due(step)
        return self.every > 0 and step % self.every == 0

    def pause(self, seconds: float) -> None:
        """`seconds` of the current window were not training (an eval)."""
        self.paused_s += seconds
        self.eval_s += seconds

    def window(self, steps: int, elapsed: float) -> float:
        """A log window of `steps` steps ended after `elapsed` seconds: its training time (`elapsed`
        less the window's saves and evals) to the clock, and returned: the window's rates divide by it."""
        train_s = max(0.0, elapsed - self.paused_s)
        self.clock.add(steps, train_s)
        self.paused_s = 0.0
        return train_s

    def take_pauses(self) -> dict[str, float]:
        """The seconds of blocking saves and of evals since the last call (a log window, a stop, the
        end): the fields that the train, stop and end records carry for the goodput ledger."""
        out = {"ckpt_s": round(self.ckpt_s, 4), "eval_s": round(self.eval_s, 4)}
        self.ckpt_s = self.eval_s = 0.0
        return out

    def on_disk(self, step: int, periodic: bool) -> None:
        """A periodic save was due at `step`, whose checkpoint exists already: auto's next save is one
        interval on, not at every step."""
        if periodic and self.auto:
            self.auto.start(step)

    def saved(self, step: int, save_s: float, periodic: bool) -> None:
        """A save at `step` took `save_s` (paused out of the clock); after a periodic one, auto's next
        due step, and a new interval is a `ckpt_interval` record and a line in rank 0's log."""
        self.paused_s += save_s
        self.ckpt_s += save_s
        if not (periodic and self.auto):
            return
        step_s = self.clock.step_s() or (time.perf_counter() - self.started[1]) / max(1, step - self.started[0])
        save_s, step_s = agree_max([save_s, step_s], self.control_group)
        rec = self.auto.saved(step, save_s, step_s)
        if rec is None:
            return
        self.metrics.write("ckpt_interval", step=step, **rec)
        if self.is_main:
            log.info(
                "checkpoint interval: every %d steps (%.0f s) = sqrt(2 x save %.2f s x MTBF %.3g h, %s) / step "
                "%.3g s; next at step %d",
                rec["interval_steps"],
                rec["interval_s"],
                save_s,
                rec["mtbf_h"],
                rec["mtbf_source"],
                step_s,
                rec["next_step"],
            )

"""What follows a non-finite value or a loss spike (train.guard detects them): back to the last good
checkpoint, skipping the batches that led there, or stop with `RunDiverged` (train.on_nonfinite,
train.max_rollbacks).

`Rollback` is a part of `train.loop.Trainer`, kept apart by concern: its methods read and set the
Trainer's attributes (set in `Trainer.__init__`) and call its checkpoint methods (train.ckpt_state).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch.distributed as td

from hpctrain.errors import UserError
from hpctrain.train import checkpoint as ckpt
from hpctrain.train import guard

log = logging.getLogger("hpctrain")


class RunDiverged(UserError, RuntimeError):
    """A non-finite loss or a spike that train.on_nonfinite says to stop on (or rollbacks used up)."""


class Rollback:
    """The rollback part of `train.loop.Trainer` (its only user)."""

    def _rollback(self, e: guard.Diverged) -> None:
        """Back to the last good checkpoint, skipping the batches that led to `e` (PaLM's remedy for
        spikes), or stop with RunDiverged per train.on_nonfinite / train.max_rollbacks. Every rank
        runs this at the same step; the checkpoint is rank 0's choice, broadcast."""
        t = self.cfg.train
        self.stop_round.result()  # the round posted at the last boundary: none may stay in flight
        self.stragglers.settle()
        self._collect()
        self.rollbacks += 1
        detail = {k: v for k, v in e.detail.items() if not (isinstance(v, float) and not math.isfinite(v))}
        self.metrics.write("nonfinite", step=e.step, reason=e.reason, count=self.rollbacks, **detail)
        # every checkpoint was saved from a state with no non-finite value (Trainer._checkpoint); one saved
        # since the last clean log boundary may already be inside a spike: then only the known-good ones
        path = self._good_checkpoint(self.step if e.reason == "nonfinite" else self.good_step)
        why = None
        if t.on_nonfinite == "stop":
            why = "train.on_nonfinite=stop"
        elif self.rollbacks > t.max_rollbacks:
            why = f"train.max_rollbacks={t.max_rollbacks} used up"
        elif path is None:
            why = "no good checkpoint to roll back to (lower train.ckpt_every)"
        if why:
            self.metrics.write("stop", step=e.step, reason="diverged", stop_kind="nonfinite", detail=why)
            self.metrics.close()
            what = "a non-finite loss or gradient norm" if e.reason == "nonfinite" else "a loss spike"
            kept = f"the last good checkpoint is {path.name}" if path else "no good checkpoint exists"
            fix = {"train.on_nonfinite=stop": " (or train.on_nonfinite=rollback)"}.get(why, "")
            raise RunDiverged(f"training stopped at step {e.step}: {what} ({why}); {kept}, nothing after it was "
                              f"saved. Lower optim.lr or set optim.clip_grad{fix}, then resume")
        count = self.rollbacks
        self.load_state(ckpt.load_resume(path), path)
        self.rollbacks = count  # the checkpoint's count is older
        skip = t.rollback_skip_batches or max(1, e.step - self.step)
        self.data_offset += skip
        self.finite.clear()
        self._supersede_records()
        self.metrics.write("rollback", step=self.step, from_step=e.step, reason=e.reason, checkpoint=path.name,
                           skip_batches=skip, data_offset=self.data_offset, count=count)
        log.warning("%s at step %d: rolled back to %s (rollback %d of at most %d), skipping %d batches",
                    e.reason, e.step, path.name, count, t.max_rollbacks, skip)
        if self.step < self.total_steps:
            self.stop_round.start(self.stop_flag.bits())

    def _good_checkpoint(self, limit: int) -> Path | None:
        """The newest checkpoint at or before step `limit` (rank 0 lists, every rank learns it)."""
        choice: list = [None]
        root = self.ckpt_root or self.run_dir
        if self.dist.is_main and root and limit >= 0:
            older = [p for p in ckpt.list_checkpoints(root) if ckpt.step_of(p) <= limit]
            choice[0] = str(older[0]) if older else None
        if td.is_initialized():
            td.broadcast_object_list(choice, src=0, group=self.control_group)
        return Path(choice[0]) if choice[0] else None

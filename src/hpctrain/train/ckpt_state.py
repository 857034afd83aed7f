"""The Trainer's checkpoints: what one holds (model, optimizer, EMA, scaler, RNG streams, loader
position, schedule), writing it (one file by rank 0, or sharded by every rank, in the background
with `train.ckpt_async`), settling a save on every rank alike, and loading one back.

`CheckpointState` is a part of `train.loop.Trainer`, kept apart by concern: its methods read and
set the Trainer's attributes (set in `Trainer.__init__`). When a save is due is the loop's.
"""

from __future__ import annotations

import datetime
import logging
import random
from pathlib import Path

import torch
import torch.distributed as td

from hpctrain.config import to_dict
from hpctrain.train import checkpoint as ckpt
from hpctrain.train import compat, fsdp, sharded
from hpctrain.train.dist import agree
from hpctrain.train.seeding import rng_state, step_seed

log = logging.getLogger("hpctrain")


class CheckpointState:
    """The checkpoint part of `train.loop.Trainer` (its only user)."""

    def _init_checkpoints(self) -> None:
        """The checkpoint format, and for sharded ones the directory every rank writes to (rank 0's
        run directory) and the gloo group of background saves (their collectives run on another
        thread than training's, so they must not share its groups, as torchtitan does)."""
        t = self.cfg.train
        self.ckpt_format = compat.ckpt_format(t, self.dist.world_size)
        self.ckpt_root, self.ckpt_group, self.pending = self.run_dir, None, None
        if self.ckpt_format == "sharded" and td.is_initialized():
            root = [str(self.run_dir) if self.run_dir else None]
            td.broadcast_object_list(root, src=0, group=self.control_group)
            self.ckpt_root = Path(root[0]) if root[0] else None
            if t.ckpt_async:
                self.ckpt_group = td.new_group(backend="gloo", timeout=datetime.timedelta(seconds=t.pg_timeout_s))

    def _meta(self) -> dict:
        """Everything of a checkpoint but the model, optimizer and EMA tensors (a collective: every
        rank's RNG state is gathered, since each rank draws its own)."""
        rngs = [rng_state(self.device)]
        if td.is_initialized():
            rngs = [None] * self.dist.world_size
            td.all_gather_object(rngs, rng_state(self.device), group=self.control_group)
        return {
            "format": 1,
            "step": self.step,
            "epoch": self.step // self.steps_per_epoch,
            "eval_pending": self.eval_pending,
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "schedule": {"peak_lr": self.cfg.peak_lr, "warmup": self.warmup, "total": self.total_steps},
            "loader": {"epoch": (self.step + self.data_offset) // self.steps_per_epoch,
                       "batch": ((self.step + self.data_offset) % self.steps_per_epoch) * self.accum},
            "data_offset": self.data_offset,
            "rollbacks": self.rollbacks,
            "best": list(self.best) if self.best else None,
            "rng": rngs,
            "world_size": self.dist.world_size,
            "global_batch": self.cfg.data.batch_size,
            "config": to_dict(self.cfg),
        }

    def state(self) -> dict:
        """The single-file checkpoint: full model and optimizer (gathered under FSDP) and the rest."""
        return {
            **self._meta(),
            "model": self._fsdp().model_state(self.model) if self.fsdp else self.model.state_dict(),
            "optimizer": (self._fsdp().optimizer_state(self.model, self.optimizer) if self.fsdp
                          else self.optimizer.state_dict()),
            "ema": self.ema.state_dict() if self.ema else None,
        }

    def sharded_state(self) -> tuple[dict, dict]:
        """(tensors for DCP: this rank's part of model, optimizer and EMA, by parameter name; the
        rest, which rank 0 writes as meta.pt)."""
        model, optim, groups = sharded.model_optim_state(self.model, self.optimizer)
        tensors = {"model": model, "optim": optim}
        if self.ema:
            tensors["ema"] = self.ema.state_dict()
        return tensors, {**self._meta(), "param_groups": groups, "has_ema": self.ema is not None}

    def load_state(self, st: dict, path: Path) -> None:
        if ckpt.is_sharded(path):
            ema = self.ema.module if self.ema and st.get("has_ema") else None
            sharded.load_into(path, self.model, self.optimizer, ema, st["param_groups"],
                              self.ckpt_group or self.control_group)
        elif self.fsdp:
            self._fsdp().load(self.model, self.optimizer, st["model"], st["optimizer"])
        else:
            self.model.load_state_dict(st["model"])
            self.optimizer.load_state_dict(st["optimizer"])
        if self.scaler and st.get("scaler"):
            self.scaler.load_state_dict(st["scaler"])
        if self.ema and st.get("ema") and not ckpt.is_sharded(path):
            self.ema.load_state_dict(st["ema"])
        self.step = int(st["step"])
        self.last_saved_step = self.step  # on disk already: never saved again (nor in another format)
        self.good_step = self.step  # it trained on, or it was resumed from: known good
        self.data_offset = int(st.get("data_offset", 0))  # absent before rollbacks existed
        self.rollbacks = int(st.get("rollbacks", 0))
        self.best = tuple(st["best"]) if st.get("best") else None
        self.eval_pending = bool(st.get("eval_pending", False))  # absent in older checkpoints
        rngs = st.get("rng") or []
        if len(rngs) == self.dist.world_size:
            mine = rngs[self.dist.rank]
            torch.set_rng_state(mine["torch"])
            random.setstate(mine["python"])
            if "cuda" in mine and self.device.type == "cuda":
                torch.cuda.set_rng_state(mine["cuda"], self.device)
        else:  # another world size: a fresh stream per rank, from the seed and the step
            seed = step_seed(self.cfg.train.seed, self.step, self.dist.rank)
            torch.manual_seed(seed)
            random.seed(seed)

    @staticmethod
    def _fsdp():
        return fsdp

    def save(self, background: bool = False) -> str | None:
        """Checkpoint this step; every rank learns whether it worked (a unanimous decision).

        A background save (sharded, `train.ckpt_async`) returns at once, with the path of the one
        before it if that completed; its own outcome is settled when the next save starts (which
        waits for it) or the run ends (`_collect`).
        """
        previous = self._collect()
        t = self.cfg.train
        if self.ckpt_format == "single":
            state = self.state()
            path, err = None, None
            if self.dist.is_main and self.run_dir:
                try:
                    path = ckpt.save(self.run_dir, self.step, state, t.keep_ckpts, protect=self._protected())
                except ckpt.CheckpointError as e:
                    err = e
            return self._saved(self.step, path, err)
        tensors, meta = self.sharded_state()
        if self.ckpt_root is None:  # nowhere to write (a test's trainer without a run directory)
            self.last_saved_step = self.step
            return None
        args = (self.ckpt_root, self.step, tensors, meta, t.keep_ckpts, self.dist.is_main)
        if background and t.ckpt_async:
            self.pending = sharded.start(*args, group=self.ckpt_group, protect=self._protected())
            self.last_saved_step = self.step  # in flight: this step is not saved again
            return previous
        path, err = sharded.save(*args, group=self.ckpt_group or self.control_group, protect=self._protected())
        return self._saved(self.step, path, err)

    def _saved(self, step: int, path: Path | None, err: ckpt.CheckpointError | None) -> str | None:
        """Settle a save made now: a step whose save failed may be saved again (at a stop)."""
        failed, out = self._settle(step, path, err)
        if not failed:
            self.last_saved_step = step
        return out

    def _settle(self, step: int, path: Path | None, err: ckpt.CheckpointError | None) -> tuple[bool, str | None]:
        """Record a written checkpoint; on a failure anywhere, stop or warn per train.on_ckpt_error.
        Returns (failed on some rank, the path on rank 0)."""
        if path:
            self.metrics.write("checkpoint", step=step, path=str(path))  # on disk now, whatever follows
        failed = agree(err is not None, self.control_group)
        if failed:
            if self.cfg.train.on_ckpt_error == "stop":
                raise err or ckpt.CheckpointError(f"the checkpoint of step {step} was not written on another "
                                                  "rank (see its log)")
            log.warning("checkpoint at step %d not written (train.on_ckpt_error=continue): %s",
                        step, err or "see the other ranks' logs")
            return True, None
        return False, str(path) if path else None

    def _collect(self) -> str | None:
        """Wait for the background save in flight, if any, and settle it (every rank calls this)."""
        if self.pending is None:
            return None
        pending, self.pending = self.pending, None
        return self._settle(pending.step, *pending.wait())[1]

    def _protected(self) -> tuple[int, ...]:
        """Checkpoint steps that pruning keeps beside the newest: the last known good, the best eval's."""
        return (self.good_step, *((self.best[1],) if self.best and self.cfg.train.keep_best else ()))

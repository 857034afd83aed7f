"""The Trainer's checkpoints: what one holds (model, optimizer, EMA, scaler, RNG streams, the
`TrainState`, loader position, schedule), writing it (one file by rank 0, or sharded by every
rank, in the background with `ckpt.async_save`), settling a save on every rank alike, loading
one back, and finding the newest good one for a rollback.

A `Checkpointer` is given the parts it saves (`Parts`, as torchtitan's `states=`), so it reads
nothing else of the Trainer. When a save is due is train.ckpt.cadence's.
"""

from __future__ import annotations

import datetime
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as td

from hpctrain.config import Config, to_dict
from hpctrain.run.metrics import MetricsWriter
from hpctrain.train import compat, fsdp
from hpctrain.train.ckpt import checkpoint as ckpt
from hpctrain.train.ckpt import sharded
from hpctrain.train.collective import agree
from hpctrain.train.dist import DistInfo
from hpctrain.train.optim.ema import EMA
from hpctrain.train.seeding import rng_state, step_seed
from hpctrain.train.state import TrainState

log = logging.getLogger("hpctrain")


@dataclass(frozen=True)
class Parts:
    """What a checkpoint restores, beside the RNG streams (torchtitan's `states=`)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    ema: EMA | None
    scaler: Any | None  # a GradScaler under fp16
    state: TrainState


@dataclass(frozen=True)
class Layout:
    """How steps map to the loader, and how the model is held: fixed for a run."""

    steps_per_epoch: int
    accum: int
    fsdp: bool


class Checkpointer:
    """Saves and loads `Parts`; every rank calls every method (each one is a collective)."""

    def __init__(
        self,
        cfg: Config,
        dist: DistInfo,
        device: torch.device,
        run_dir: Path | None,
        control_group,
        metrics: MetricsWriter,
        parts: Parts,
        layout: Layout,
        schedule: Callable[[], dict],
    ):
        """`schedule`: the learning-rate schedule's record, read at each save (a benchmark moves
        the run's end). The format, and for sharded checkpoints the directory every rank writes to
        (rank 0's run directory) and the gloo group of background saves (their collectives run on
        another thread than training's, so they must not share its groups, as torchtitan does)."""
        self.cfg, self.dist, self.device, self.run_dir = cfg, dist, device, run_dir
        self.control_group, self.metrics = control_group, metrics
        self.parts = parts  # dropped by close(): nothing saves afterwards
        self.layout, self.schedule = layout, schedule
        self.format = compat.ckpt_format(cfg.ckpt, dist.world_size)
        self.root, self.group = run_dir, None
        self.pending: sharded.Pending | None = None
        if self.format == "sharded" and td.is_initialized():
            root = [str(run_dir) if run_dir else None]
            td.broadcast_object_list(root, src=0, group=control_group)
            self.root = Path(root[0]) if root[0] else None
            if cfg.ckpt.async_save:
                self.group = td.new_group(backend="gloo", timeout=datetime.timedelta(seconds=cfg.dist.pg_timeout_s))

    @property
    def state(self) -> TrainState:
        return self.parts.state

    def meta(self) -> dict:
        """Everything of a checkpoint but the model, optimizer and EMA tensors (a collective: every
        rank's RNG state is gathered, since each rank draws its own). Keys and order as ever."""
        rngs = [rng_state(self.device)]
        if td.is_initialized():
            rngs = [None] * self.dist.world_size
            td.all_gather_object(rngs, rng_state(self.device), group=self.control_group)
        st, lay, scaler = self.state.state_dict(), self.layout, self.parts.scaler
        epoch, pos = self.state.loader_position(lay.steps_per_epoch)
        return {
            "format": 1,
            "step": st["step"],
            "epoch": st["step"] // lay.steps_per_epoch,
            "eval_pending": st["eval_pending"],
            "scaler": scaler.state_dict() if scaler else None,
            "schedule": self.schedule(),
            "loader": {"epoch": epoch, "batch": pos * lay.accum},
            "data_offset": st["data_offset"],
            "rollbacks": st["rollbacks"],
            "best": st["best"],
            "rng": rngs,
            "world_size": self.dist.world_size,
            "global_batch": self.cfg.data.global_batch,
            "config": to_dict(self.cfg),
        }

    def full_state(self) -> dict:
        """The single-file checkpoint: full model and optimizer (gathered under FSDP) and the rest."""
        p = self.parts
        return {
            **self.meta(),
            "model": fsdp.model_state(p.model) if self.layout.fsdp else p.model.state_dict(),
            "optimizer": (fsdp.optimizer_state(p.model, p.optimizer) if self.layout.fsdp else p.optimizer.state_dict()),
            "ema": p.ema.state_dict() if p.ema else None,
        }

    def sharded_state(self) -> tuple[dict, dict]:
        """(tensors for DCP: this rank's part of model, optimizer and EMA, by parameter name; the
        rest, which rank 0 writes as meta.pt)."""
        p = self.parts
        model, optim, groups = sharded.model_optim_state(p.model, p.optimizer)
        tensors = {"model": model, "optim": optim}
        if p.ema:
            tensors["ema"] = p.ema.state_dict()
        return tensors, {**self.meta(), "param_groups": groups, "has_ema": p.ema is not None}

    def load(self, st: dict, path: Path) -> None:
        """Restore every part and this rank's RNG streams (a fresh stream per rank from the seed and
        the step when the checkpoint came from another world size)."""
        p = self.parts
        if ckpt.is_sharded(path):
            ema = p.ema.module if p.ema and st.get("has_ema") else None
            sharded.load_into(path, p.model, p.optimizer, ema, st["param_groups"], self.group or self.control_group)
        elif self.layout.fsdp:
            fsdp.load(p.model, p.optimizer, st["model"], st["optimizer"])
        else:
            p.model.load_state_dict(st["model"])
            p.optimizer.load_state_dict(st["optimizer"])
        if p.scaler and st.get("scaler"):
            p.scaler.load_state_dict(st["scaler"])
        if p.ema and st.get("ema") and not ckpt.is_sharded(path):
            p.ema.load_state_dict(st["ema"])
        self.state.load_state_dict(st)
        rngs = st.get("rng") or []
        if len(rngs) == self.dist.world_size:
            mine = rngs[self.dist.rank]
            torch.set_rng_state(mine["torch"])
            random.setstate(mine["python"])
            if "cuda" in mine and self.device.type == "cuda":
                torch.cuda.set_rng_state(mine["cuda"], self.device)
        else:  # another world size: a fresh stream per rank, from the seed and the step
            seed = step_seed(self.cfg.train.seed, self.state.step, self.dist.rank)
            torch.manual_seed(seed)
            random.seed(seed)

    def save(self, background: bool = False) -> str | None:
        """Checkpoint this step; every rank learns whether it worked (a unanimous decision).

        A background save (sharded, `ckpt.async_save`) returns at once, with the path of the one
        before it if that completed; its own outcome is settled when the next save starts (which
        waits for it) or the run ends (`collect`).
        """
        previous = self.collect()
        _t, st = self.cfg.train, self.state
        if self.format == "single":
            state = self.full_state()
            path, err = None, None
            if self.dist.is_main and self.run_dir:
                try:
                    path = ckpt.save(self.run_dir, st.step, state, self.cfg.ckpt.keep, protect=self._protected())
                except ckpt.CheckpointError as e:
                    err = e
            return self._saved(st.step, path, err)
        tensors, meta = self.sharded_state()
        if self.root is None:  # nowhere to write (a test's trainer without a run directory)
            st.last_saved_step = st.step
            return None
        args = (self.root, st.step, tensors, meta, self.cfg.ckpt.keep, self.dist.is_main)
        if background and self.cfg.ckpt.async_save:
            self.pending = sharded.start(*args, group=self.group, protect=self._protected())
            st.last_saved_step = st.step  # in flight: this step is not saved again
            return previous
        path, err = sharded.save(*args, group=self.group or self.control_group, protect=self._protected())
        return self._saved(st.step, path, err)

    def collect(self) -> str | None:
        """Wait for the background save in flight, if any, and settle it (every rank calls this)."""
        if self.pending is None:
            return None
        pending, self.pending = self.pending, None
        return self._settle(pending.step, *pending.wait())[1]

    def good_checkpoint(self, limit: int) -> Path | None:
        """The newest checkpoint at or before step `limit` (rank 0 lists, every rank learns it)."""
        choice: list = [None]
        root = self.root or self.run_dir
        if self.dist.is_main and root and limit >= 0:
            older = [p for p in ckpt.list_checkpoints(root) if ckpt.step_of(p) <= limit]
            choice[0] = str(older[0]) if older else None
        if td.is_initialized():
            td.broadcast_object_list(choice, src=0, group=self.control_group)
        return Path(choice[0]) if choice[0] else None

    def close(self) -> None:
        """Settle the save in flight, then drop the parts and groups (they hold the process groups:
        see `Trainer.close`). Idempotent."""
        self.collect()
        vars(self).pop("parts", None)  # the references go; a use after close is an AttributeError
        self.control_group = self.group = None
        self.schedule = dict

    def _saved(self, step: int, path: Path | None, err: ckpt.CheckpointError | None) -> str | None:
        """Settle a save made now: a step whose save failed may be saved again (at a stop)."""
        failed, out = self._settle(step, path, err)
        if not failed:
            self.state.last_saved_step = step
        return out

    def _settle(self, step: int, path: Path | None, err: ckpt.CheckpointError | None) -> tuple[bool, str | None]:
        """Record a written checkpoint; on a failure anywhere, stop or warn per ckpt.on_error.
        Returns (failed on some rank, the path on rank 0)."""
        if path:
            self.metrics.write("checkpoint", step=step, path=str(path))  # on disk now, whatever follows
        failed = agree(err is not None, self.control_group)
        if failed:
            if self.cfg.ckpt.on_error == "stop":
                raise err or ckpt.CheckpointError(
                    f"the checkpoint of step {step} was not written on another rank (see its log)"
                )
            log.warning(
                "checkpoint at step %d not written (ckpt.on_error=continue): %s",
                step,
                err or "see the other ranks' logs",
            )
            return True, None
        return False, str(path) if path else None

    def _protected(self) -> tuple[int, ...]:
        """Checkpoint steps that pruning keeps beside the newest: the last known good, the best eval's."""
        st = self.state
        return (st.good_step, *((st.best[1],) if st.best and self.cfg.ckpt.keep_best else ()))

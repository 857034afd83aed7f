"""What follows a non-finite value or a loss spike (train/health/guard.py detects them): back to the last good
checkpoint, skipping the batches that led there, or stop with `RunDiverged` (health.on_nonfinite,
health.max_rollbacks).

Functions over the `Checkpointer`, the `TrainState` and the metrics, so a rollback reads nothing
else of the Trainer; the Trainer settles its rounds before and restarts them after.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from hpctrain.config import HealthConfig
from hpctrain.errors import UserError
from hpctrain.run.metrics import MetricsWriter
from hpctrain.train.ckpt import checkpoint as ckpt
from hpctrain.train.ckpt.checkpointer import Checkpointer
from hpctrain.train.health import guard
from hpctrain.train.state import TrainState

log = logging.getLogger("hpctrain")


class RunDiverged(UserError, RuntimeError):
    """A non-finite loss or a spike that health.on_nonfinite says to stop on (or rollbacks used up)."""


def stop_reason(t: HealthConfig, rollbacks: int, path: Path | None) -> str | None:
    """Why the run stops instead of rolling back (None: it rolls back to `path`)."""
    if t.on_nonfinite == "stop":
        return "health.on_nonfinite=stop"
    if rollbacks > t.max_rollbacks:
        return f"health.max_rollbacks={t.max_rollbacks} used up"
    if path is None:
        return "no good checkpoint to roll back to (lower ckpt.every)"
    return None


def diverged(e: guard.Diverged, why: str, path: Path | None) -> RunDiverged:
    """The one-line error of a run that stops on `e`."""
    kept = f"the last good checkpoint is {path.name}" if path else "no good checkpoint exists"
    fix = {"health.on_nonfinite=stop": " (or health.on_nonfinite=rollback)"}.get(why, "")
    return RunDiverged(
        f"training stopped at step {e.step}: {e.reason.what} ({why}); {kept}, nothing after it was "
        f"saved. Lower optim.lr or set optim.clip_grad{fix}, then resume"
    )


def restore(
    e: guard.Diverged, ckpts: Checkpointer, state: TrainState, t: HealthConfig, metrics: MetricsWriter
) -> tuple[Path, int]:
    """Back to the last good checkpoint, skipping the batches that led to `e` (PaLM's remedy for
    spikes), or raise RunDiverged per health.on_nonfinite / health.max_rollbacks. Every rank runs
    this at the same step; the checkpoint is rank 0's choice, broadcast. Returns (the checkpoint,
    the batches skipped)."""
    ckpts.collect()
    state.rollbacks += 1
    detail = {k: v for k, v in e.detail.items() if not (isinstance(v, float) and not math.isfinite(v))}
    metrics.write("nonfinite", step=e.step, reason=e.reason.value, count=state.rollbacks, **detail)
    # every checkpoint was saved from a state with no non-finite value (Trainer._checkpoint); one saved
    # since the last clean log boundary may already be inside a spike: then only the known-good ones
    path = ckpts.good_checkpoint(state.step if e.reason is guard.Reason.NONFINITE else state.good_step)
    why = stop_reason(t, state.rollbacks, path)
    if why:
        metrics.write("stop", step=e.step, reason="diverged", stop_kind="nonfinite", detail=why)
        metrics.close()
        raise diverged(e, why, path)
    count = state.rollbacks
    ckpts.load(ckpt.load_resume(path), path)
    state.rollbacks = count  # the checkpoint's count is older
    skip = t.rollback_skip_batches or max(1, e.step - state.step)
    state.data_offset += skip
    return path, skip


def report(
    e: guard.Diverged, path: Path, skip: int, state: TrainState, t: HealthConfig, metrics: MetricsWriter
) -> None:
    """The `rollback` record and the log line, once the state is back at `path`."""
    metrics.write(
        "rollback",
        step=state.step,
        from_step=e.step,
        reason=e.reason.value,
        checkpoint=path.name,
        skip_batches=skip,
        data_offset=state.data_offset,
        count=state.rollbacks,
    )
    log.warning(
        "%s at step %d: rolled back to %s (rollback %d of at most %d), skipping %d batches",
        e.reason.value,
        e.step,
        path.name,
        state.rollbacks,
        t.max_rollbacks,
        skip,
    )

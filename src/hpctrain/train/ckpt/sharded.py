"""Sharded checkpoints with torch.distributed.checkpoint (DCP): every rank writes and reads its part.

`checkpoints/step-<n>/` holds DCP's files (one `.distcp` per writing rank and `.metadata`) and
`meta.pt`: everything that is not a model, optimizer or EMA tensor (step, every rank's RNG state,
loader position, config, scaler, the optimizer's param_groups), written by rank 0 and read with
`torch.load(weights_only=True)`. Only tensors go through DCP, because DCP reads any other entry
with `torch.load(weights_only=False)` (docs/checkpoints.md).

The ranks write into `.step-<n>.tmp/`; rank 0 renames it to `step-<n>/` after DCP's save has
returned there (which is after every rank's files and the `.metadata` are written) and `meta.pt`
is fsynced, and only then moves `latest`. A real name is a complete checkpoint; a kill at any
point leaves at most a `.tmp` directory, removed by the next save.

In the background (`ckpt.async_save`), `dcp.async_save` copies the state to CPU memory on the
calling thread and writes it from a thread of its own; its collectives run on that thread, so they
get a gloo group of their own, never the one DDP or the stop flag use from the training thread.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from hpctrain.run.layout import fsync_dir
from hpctrain.train.ckpt import checkpoint as ckpt


def tmp_dir(final: Path) -> Path:
    return final.with_name(f".{final.name}.tmp")


def model_optim_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict, list]:
    """Model and optimizer state as DCP wants them: parameter names for keys, this rank's shard of
    each tensor under FSDP (DTensors), whole tensors otherwise. Returns (model, optimizer state,
    param_groups); the tensors share storage with the live ones."""
    # torch.distributed.checkpoint: 2 s to import; only sharded checkpoints
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    osd = get_optimizer_state_dict(model, optimizer)
    return get_model_state_dict(model), osd["state"], osd["param_groups"]


def load_into(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    ema: torch.nn.Module | None,
    param_groups: list,
    group=None,
) -> None:
    """Read this rank's part of a sharded checkpoint into the model, optimizer and EMA (a collective).

    DCP reshards: the checkpoint may come from another world size or parallelism.
    """
    import torch.distributed.checkpoint as dcp  # torch.distributed.checkpoint: 2 s to import; only sharded checkpoints
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    msd, ostate, _ = model_optim_state(model, optimizer)  # a fresh optimizer gets zero state to fill
    want: dict[str, Any] = {"model": msd, "optim": ostate}
    if ema is not None:
        want["ema"] = ema.state_dict()
    dcp.load(want, checkpoint_id=str(path), process_group=group)
    set_model_state_dict(model, want["model"])
    set_optimizer_state_dict(model, optimizer, {"state": want["optim"], "param_groups": param_groups})
    if ema is not None:
        ema.load_state_dict(want["ema"])


def _alone() -> bool:
    """No process group (one process): DCP writes everything itself (and says nothing about it)."""
    return not (torch.distributed.is_available() and torch.distributed.is_initialized())


def _finalize(run_dir: Path, step: int, meta: dict, keep: int, protect: tuple[int, ...] = ()) -> Path:
    """Rank 0, once every rank's part is on disk: meta.pt, rename to the real name, `latest`, prune."""
    d = ckpt.ckpt_dir(run_dir)
    final = d / ckpt.name(step, "sharded")
    tmp = tmp_dir(final)
    ckpt.save_file(tmp / ckpt.META, lambda f: torch.save(meta, f))
    if final.exists():  # the same step saved again by a later attempt: the new one replaces it
        old = final.with_name(f".{final.name}.old")
        os.replace(final, old)
        shutil.rmtree(old, ignore_errors=True)
    os.replace(tmp, final)
    fsync_dir(d)
    ckpt.point_latest(d, final)
    ckpt.drop_other_format(final)
    ckpt.prune(run_dir, keep, protect)
    return final


def _start_dir(run_dir: Path, step: int, is_main: bool) -> Path:
    d = ckpt.ckpt_dir(run_dir)
    tmp = tmp_dir(d / ckpt.name(step, "sharded"))
    if is_main:
        d.mkdir(parents=True, exist_ok=True, mode=0o755)
        ckpt.clear_stale(d, keep=tmp)
    return tmp


def _failure(run_dir: Path, step: int, e: BaseException, is_main: bool) -> ckpt.CheckpointError:
    final = ckpt.ckpt_dir(run_dir) / ckpt.name(step, "sharded")
    if is_main:
        shutil.rmtree(tmp_dir(final), ignore_errors=True)
    return ckpt.write_error(run_dir, final, e)


def save(
    run_dir: Path,
    step: int,
    tensors: dict,
    meta: dict,
    keep: int,
    is_main: bool,
    group=None,
    protect: tuple[int, ...] = (),
) -> tuple[Path | None, ckpt.CheckpointError | None]:
    """Write a sharded checkpoint now (a collective). Returns (path on rank 0, error)."""
    import torch.distributed.checkpoint as dcp  # torch.distributed.checkpoint: 2 s to import; only sharded checkpoints
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: caught by name

    tmp = _start_dir(run_dir, step, is_main)
    try:
        with warnings.catch_warnings():  # alone: "assuming the intent is to save in a single process"
            if _alone():
                warnings.simplefilter("ignore", UserWarning)
            dcp.save(tensors, checkpoint_id=str(tmp), process_group=group)  # no_dist: compat.py, DCP table
        return (_finalize(run_dir, step, meta, keep, protect) if is_main else None), None
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP gathers every rank's failure
        return None, _failure(run_dir, step, e, is_main)


class Pending:
    """A save in the background: `wait()` gives (path on rank 0, error), as `save` does."""

    def __init__(self, step: int, run: Any):
        self.step = step
        self.result: tuple[Path | None, ckpt.CheckpointError | None] = (None, None)
        self.finished_at: float | None = None  # time.perf_counter() when the save was done (or failed)
        self._thread = threading.Thread(target=self._run, args=(run,), name=f"ckpt-step-{step}", daemon=True)
        self._thread.start()

    def _run(self, run) -> None:
        self.result = run()
        self.finished_at = time.perf_counter()

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> tuple[Path | None, ckpt.CheckpointError | None]:
        self._thread.join()
        return self.result


def _cpu_copied(tree: Any) -> Any:
    """`tree` with every CPU tensor copied. torch 2.4 and 2.5's async_save "copies" to CPU memory
    with `tensor.to("cpu")`, which returns a CPU tensor itself: its background thread then wrote the
    live weights while the next steps changed them (measured: a resume from a background save on a
    loaded machine, torch 2.5.1, differed from the run straight through). GPU tensors are copied by
    async_save itself."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().clone() if tree.device.type == "cpu" else tree
    if isinstance(tree, dict):
        return {k: _cpu_copied(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_cpu_copied(v) for v in tree)
    return tree


def start(
    run_dir: Path,
    step: int,
    tensors: dict,
    meta: dict,
    keep: int,
    is_main: bool,
    group=None,
    protect: tuple[int, ...] = (),
) -> Pending:
    """Copy the state to CPU memory now, write it in the background (a collective on `group`)."""
    import torch.distributed.checkpoint as dcp  # torch.distributed.checkpoint: 2 s to import; only sharded checkpoints
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: caught by name

    tmp = _start_dir(run_dir, step, is_main)
    try:
        future = dcp.async_save(_cpu_copied(tensors), checkpoint_id=str(tmp), process_group=group)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - e.g. no memory for the CPU copy
        failed = (None, _failure(run_dir, step, e, is_main))
        return Pending(step, lambda: failed)

    def finish():
        try:
            future.result()
            return (_finalize(run_dir, step, meta, keep, protect) if is_main else None), None
        except (Exception, CheckpointException) as e:  # noqa: BLE001
            return None, _failure(run_dir, step, e, is_main)

    return Pending(step, finish)

"""Atomic checkpoints in `<run>/checkpoints/`: temp file, fsync, rename, then the `latest` pointer.

Two formats share the directory: `step-<n>.pt`, one file rank 0 writes (`ckpt.format=single`),
and `step-<n>/`, a sharded DCP checkpoint every rank writes its part of (train/ckpt/sharded.py).
A process killed mid-write leaves only a `.tmp` file or directory behind, never a half checkpoint
under a real name; `--resume auto` walks back from the newest until one loads. Files load with
`torch.load(weights_only=True)`, so a checkpoint cannot run code.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from hpctrain.errors import UserError
from hpctrain.run.layout import CHECKPOINTS, atomic_write
from hpctrain.train import compat

log = logging.getLogger("hpctrain")
META = "meta.pt"  # a sharded checkpoint's non-tensor part (train/ckpt/sharded.py)
PARTS = ("model", "optim", "ema")  # its DCP top-level keys: tensors only
PATTERN = re.compile(r"^step-(\d+)(\.pt)?$")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be written or read, with the path and what to do."""


def ckpt_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def name(step: int, fmt: str = "single") -> str:
    """A checkpoint's name: `step-<n>.pt` (single file) or `step-<n>` (sharded, a directory)."""
    return f"step-{step:08d}" + (".pt" if fmt == "single" else "")


def step_of(path: str | Path) -> int:
    m = PATTERN.match(Path(path).name)
    if not m:
        raise CheckpointError(f"{path} is not named like a checkpoint (step-<n>.pt or step-<n>/)")
    return int(m.group(1))


def is_sharded(path: str | Path) -> bool:
    return Path(path).is_dir()


def _every_checkpoint(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint of either format, newest step first, both formats of a step
    included (a run resumed at its last step by a launch of another size wrote the second, before
    that was refused; a save replaces the other format of its step since)."""
    d = ckpt_dir(run_dir)
    if not d.is_dir():
        return []
    found = [
        (int(m.group(1)), p.name, p)
        for p in d.iterdir()
        if (m := PATTERN.match(p.name)) and (p.is_dir() == (m.group(2) is None))
    ]
    return [(step, p) for step, _, p in sorted(found, reverse=True)]


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Checkpoints of either format, newest first (by step), one per step: of two formats of one
    step, the one `latest` names, else the newer file."""
    latest = ckpt_dir(run_dir) / "latest"
    named = latest.read_text().strip() if latest.is_file() else ""
    best: dict[int, Path] = {}
    for step, p in _every_checkpoint(run_dir):
        cur = best.get(step)
        if cur is None or p.name == named or (cur.name != named and _mtime(p) > _mtime(cur)):
            best[step] = p
    return [best[step] for step in sorted(best, reverse=True)]


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:  # pruned while listed
        return 0.0


def _remove(p: Path) -> None:
    if p.is_dir():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def drop_other_format(path: Path) -> None:
    """After `path` (step n) is committed: the other format's checkpoint of step n goes, so a step is
    never on disk twice (a later save of a step replaces what an earlier attempt wrote)."""
    step = step_of(path)
    for s, p in _every_checkpoint(path.parent.parent):
        if s == step and p != path:
            _remove(p)


def save_file(path: Path, write) -> None:
    """`write(f)` to `path` atomically and durably (run.layout.atomic_write), a full disk said as
    ENOSPC: torch.save reports a short write as RuntimeError. The disk is looked at before the
    temp file is removed (removing it frees the space)."""

    def write_or_say_full(f) -> None:
        try:
            write(f)
        except BaseException as e:
            if not isinstance(e, OSError) and _disk_full(path.parent):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) from e
            raise

    atomic_write(path, write_or_say_full, sync=True)


def _why(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _disk_full(d: Path) -> bool:
    try:
        return os.statvfs(d).f_bavail == 0
    except OSError:
        return False


def write_error(run_dir: str | Path, path: Path, e: BaseException) -> CheckpointError:
    """The one-line error of a checkpoint not written, saying whether an earlier one is intact."""
    failures = getattr(e, "failures", None)  # DCP's CheckpointException: {rank: its exception}
    if isinstance(failures, dict) and failures:
        e = next(iter(failures.values()))
        e = e[0] if isinstance(e, tuple) else e
    why = _why(e)
    if _disk_full(ckpt_dir(run_dir)) and "No space left" not in why:
        why = os.strerror(errno.ENOSPC)
    prev = next((p.name for p in list_checkpoints(run_dir) if p != path), None)
    kept = f"the previous checkpoint {prev} is intact" if prev else "no earlier checkpoint exists"
    return CheckpointError(
        f"could not write checkpoint {path}: {why}; {kept}. Free space on that file "
        "system (or lower ckpt.keep) and resume with --resume auto"
    )


def clear_stale(d: Path, keep: Path | None = None) -> None:
    """Remove what killed writers left: temp files and temp directories (but `keep`)."""
    for stale in [*d.glob(".step-*.pt.tmp-*"), *d.glob(".step-*.tmp"), *d.glob(".step-*.old")]:
        if stale == keep:
            continue
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


def point_latest(d: Path, path: Path) -> None:
    save_file(d / "latest", lambda f: f.write(path.name.encode() + b"\n"))


def prune(run_dir: str | Path, keep: int, protect: tuple[int, ...] = ()) -> None:
    """Keep the newest `keep` checkpoints (steps), of either format, and the steps in `protect`: the
    last one known good (train/health/guard.py), which a rollback needs after newer ones saw a spike, and
    the best-eval one (ckpt.keep_best)."""
    kept = {step_of(p) for p in list_checkpoints(run_dir)[:keep]} | set(protect)
    for step, old in _every_checkpoint(run_dir):
        if step not in kept:
            _remove(old)


def save(run_dir: str | Path, step: int, state: dict[str, Any], keep: int, protect: tuple[int, ...] = ()) -> Path:
    """Write step-<n>.pt atomically, point `latest` at it, keep the newest `keep` (and the steps in `protect`)."""
    d = ckpt_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True, mode=0o755)
    clear_stale(d)
    path = d / name(step)
    try:
        save_file(path, lambda f: torch.save(state, f))
        point_latest(d, path)
        drop_other_format(path)
    except (OSError, RuntimeError) as e:  # torch.save reports a short write as RuntimeError
        raise write_error(run_dir, path, e) from e
    prune(run_dir, keep, protect)
    return path


def load_file(path: str | Path, map_location: Any = "cpu", need: tuple[str, ...] = ("model", "step")) -> dict[str, Any]:
    """Load one checkpoint file; refuses pickled objects (weights_only)."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    except Exception as e:  # truncated zip, pickled code, anything torch refuses
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {path} cannot be loaded safely: {first}") from None
    if not isinstance(state, dict) or any(k not in state for k in need):
        raise CheckpointError(f"checkpoint {path} is not an hpctrain checkpoint (no {'/'.join(need)})")
    return state


def load_meta(path: Path) -> dict:
    """The non-tensor state of a sharded checkpoint (weights_only), or CheckpointError; on a torch
    that cannot read one (< 2.4), a one-line ConfigError instead of falling back to an older one."""
    if compat.version_tuple() < compat.SHARDED_MIN_TORCH:
        need = ".".join(map(str, compat.SHARDED_MIN_TORCH))
        raise compat.ConfigError(
            f"checkpoint {path} is sharded (torch.distributed.checkpoint): reading it needs "
            f"torch >= {need}; this is {torch.__version__}: use an image with a newer "
            "PyTorch (or resume from a single-file checkpoint with --resume PATH)"
        )
    if not (path / ".metadata").is_file():
        raise CheckpointError(f"checkpoint {path} has no DCP .metadata (an incomplete copy?)")
    st = load_file(path / META, need=("step",))
    st["path"] = str(path)
    return st


def load_full(path: Path, parts: tuple[str, ...] = PARTS) -> dict:
    """Every tensor of a sharded checkpoint in one process, without a process group (export, tests):
    {"model": {name: tensor}, "optim": {name: {"exp_avg": ...}}, "ema": {...}} plus meta.pt's keys."""
    import torch.distributed.checkpoint as dcp  # torch.distributed.checkpoint: 2 s to import; only sharded checkpoints
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = load_meta(path)
    md = dcp.FileSystemReader(str(path)).read_metadata()
    skeleton: dict[str, Any] = {}
    for key, item in md.state_dict_metadata.items():
        where = (md.planner_data or {}).get(key, (key,))
        if where[0] not in parts or not isinstance(item, TensorStorageMetadata):
            continue
        d = skeleton
        for k in where[:-1]:
            d = d.setdefault(k, {})
        d[where[-1]] = torch.empty(item.size, dtype=item.properties.dtype)
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(skeleton, checkpoint_id=str(path))  # no process group: one process
    return {**meta, **skeleton}


def load(path: str | Path) -> dict[str, Any]:
    """The whole state of a checkpoint of either format, in this process (no process group):
    model, optimizer (torch's `state_dict` format, keyed by index), ema and the rest."""
    path = Path(path)
    if not is_sharded(path):
        return load_file(path)
    st = load_full(path)
    groups = st.pop("param_groups", [])  # parameter names → torch's indices, as in a single file
    index = {n: i for i, n in enumerate(n for g in groups for n in g["params"])}
    st["optimizer"] = {
        "state": {index[n]: v for n, v in st.pop("optim", {}).items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in groups],
    }
    return st


def load_resume(path: str | Path) -> dict[str, Any]:
    """What `--resume` reads on every rank: a single file whole; of a sharded checkpoint only the
    non-tensor part (each rank reads its tensors later, in Trainer.load_state)."""
    path = Path(path)
    if is_sharded(path):
        return load_meta(path)
    return load_file(path)


def find_resume(run_dir: str | Path, resume: str) -> tuple[Path, dict] | None:
    """`auto`: newest checkpoint that loads (say so when falling back); `none`; or a path."""
    if resume == "none":
        return None
    if resume != "auto":
        if not Path(resume).exists():
            raise CheckpointError(f"run.resume={resume!r}: no such checkpoint; give auto, none or a checkpoint path")
        return Path(resume), load_resume(resume)
    for p in list_checkpoints(run_dir):
        try:
            return p, load_resume(p)
        except CheckpointError as e:
            log.warning("skipping unusable checkpoint: %s; falling back to an older one", e)
    return None

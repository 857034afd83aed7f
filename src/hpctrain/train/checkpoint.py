"""Atomic checkpoints in `<run>/checkpoints/`: temp file, fsync, rename, then the `latest` pointer.

A process killed mid-write leaves only a `.tmp` file behind, never a half checkpoint under a real
name; `--resume auto` walks back from the newest file until one loads. Files load with
`torch.load(weights_only=True)`, so a checkpoint cannot run code.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from pathlib import Path
from typing import Any

import torch

from hpctrain.errors import UserError

log = logging.getLogger("hpctrain")
PATTERN = re.compile(r"^step-(\d+)\.pt$")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be written or read, with the path and what to do."""


def ckpt_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Checkpoints newest first (by step)."""
    d = ckpt_dir(run_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := PATTERN.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException as e:
        full = not isinstance(e, OSError) and _disk_full(path.parent)  # torch.save: RuntimeError
        tmp.unlink(missing_ok=True)
        if full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) from e
        raise


def _why(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _disk_full(d: Path) -> bool:
    try:
        return os.statvfs(d).f_bavail == 0
    except OSError:
        return False


def save(run_dir: str | Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Write step-<n>.pt atomically, point `latest` at it, keep the newest `keep`."""
    d = ckpt_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True, mode=0o755)
    for stale in d.glob(".step-*.pt.tmp-*"):
        stale.unlink(missing_ok=True)
    path = d / f"step-{step:08d}.pt"
    try:
        _atomic_write(path, lambda f: torch.save(state, f))
        _atomic_write(d / "latest", lambda f: f.write(path.name.encode() + b"\n"))
    except (OSError, RuntimeError) as e:  # torch.save reports a short write as RuntimeError
        prev = next((p.name for p in list_checkpoints(run_dir) if p != path), None)
        kept = f"the previous checkpoint {prev} is intact" if prev else "no earlier checkpoint exists"
        raise CheckpointError(f"could not write checkpoint {path}: {_why(e)}; {kept}. "
                              "Free space on that file system (or lower train.keep_ckpts) and "
                              "resume with --resume auto") from e
    for old in list_checkpoints(run_dir)[keep:]:
        old.unlink(missing_ok=True)
    return path


def load(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """Load one checkpoint; refuses pickled objects (weights_only)."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    except Exception as e:  # truncated zip, pickled code, anything torch refuses
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {path} cannot be loaded safely: {first}") from None
    if not isinstance(state, dict) or "model" not in state or "step" not in state:
        raise CheckpointError(f"checkpoint {path} is not an hpctrain checkpoint (no model/step)")
    return state


def find_resume(run_dir: str | Path, resume: str) -> tuple[Path, dict] | None:
    """`auto`: newest checkpoint that loads (say so when falling back); `none`; or a path."""
    if resume == "none":
        return None
    if resume != "auto":
        return Path(resume), load(resume)
    for p in list_checkpoints(run_dir):
        try:
            return p, load(p)
        except CheckpointError as e:
            log.warning("skipping unusable checkpoint: %s; falling back to an older one", e)
    return None

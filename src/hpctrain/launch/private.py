"""The submitit folder holds the pickles every task unpickles at each start (`<run>/submitit/`):
whoever can write one runs code as the job's owner. In a setgid project directory with umask 002,
a default mkdir makes the folder group-writable, so a group member could replace them. The folder
is made 0700 at submission, and a task refuses to start from a pickle another user can write."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from hpctrain.errors import LaunchError
from hpctrain.run.owner import GROUP_OTHER_WRITE, others_can_write


def private_dir(path: Path) -> Path:
    """Create `path` (and parents) with mode 0700 for the leaf; an existing one of ours is
    chmodded to 0700 (a run resubmitted from before, or created under umask 002)."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except PermissionError as e:  # a directory on the way is another user's, or the group's without write
        raise LaunchError(
            f"cannot create {path}: permission denied on {e.filename or path}: choose a run.dir (or run.name) "
            "under a directory you can write"
        ) from None
    if path.stat().st_uid == os.getuid():
        path.chmod(0o700)
    return path


def writable_by_others(pickle: Path) -> str | None:
    """Why a user other than this process's could replace or rewrite `pickle`; None: none can.
    The folder must be ours and writable by us only; the file matters only where others can reach
    it (the folder is traversable by them)."""
    me, folder = os.getuid(), pickle.parent
    why = others_can_write(folder)
    if why:
        return why
    if folder.stat().st_mode & (stat.S_IXGRP | stat.S_IXOTH) and pickle.exists():
        f = pickle.stat()
        if f.st_uid != me or f.st_mode & GROUP_OTHER_WRITE:
            return f"{pickle} is writable by another user (owner uid {f.st_uid}, mode {stat.S_IMODE(f.st_mode):04o})"
    return None


def check_pickle(pickle: Path) -> None:
    """Refuse (LaunchError, one line with the fix) to unpickle a job file another user could write."""
    why = writable_by_others(pickle)
    if why:
        raise LaunchError(
            f"refusing to load {pickle.name}: {why}; it runs as code in this job. Check who "
            f"changed it, then `chmod 700 {pickle.parent}` and resubmit"
        )

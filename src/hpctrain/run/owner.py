"""Who can change a directory whose files the job runs or writes as its user.

The submitit folder (launch.private), the code snapshot (run.source) and the batch shell's
`.hpctrain/` (shell/stops.sh, the same rule in bash) hold code or records that the job's user
runs or writes through. In a setgid project directory under umask 002 a default mkdir leaves
them group-writable, and a group member could then replace a file (a pickle, `train/entry.py`)
or plant a symlink: they must belong to the job's user and be writable by it alone.

The directories above them are the site's and the project's: a setgid project tree (2775) that
its group writes is the normal case, and its group, which can already replace the run's config,
data and checkpoints there, is trusted with it. A directory above that *every* user may write
without the sticky bit (`/tmp` has it) is not: anyone could rename the way to the snapshot and put
their own in its place (`world_can_rename`).

`private_dir` is the same rule for a directory of the user's own under a node's shared `/tmp`
(data.stage_to; container.stage_image's copier keeps it in bash, shell/local_image.sh).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

GROUP_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH


def others_can_write(folder: Path) -> str | None:
    """Why a user other than this process's could change what is in `folder`; None: none can."""
    me, d = os.getuid(), folder.stat()
    if d.st_uid != me:
        return f"{folder} belongs to uid {d.st_uid}, not to this job's user (uid {me})"
    if d.st_mode & GROUP_OTHER_WRITE:
        return f"{folder} is writable by its group or others (mode {stat.S_IMODE(d.st_mode):04o})"
    return None


def drop_others_write(path: Path) -> None:
    """`chmod go-w path` when it is ours (made under umask 002, or by an earlier version); another
    user's is left as it is, for `others_can_write` to name."""
    st = path.lstat()
    if st.st_uid == os.getuid() and not stat.S_ISLNK(st.st_mode) and st.st_mode & GROUP_OTHER_WRITE:
        path.chmod(stat.S_IMODE(st.st_mode) & ~GROUP_OTHER_WRITE)


def world_can_rename(folder: Path) -> str | None:
    """Why any user could rename an entry of `folder` (world-writable, no sticky bit); None: not any."""
    mode = folder.stat().st_mode
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        return f"{folder}: mode {stat.S_IMODE(mode):o}, every user may rename what is in it (no sticky bit)"
    return None


def private_dir(path: Path) -> str | None:
    """Make `path` (mode 0700) unless something is there; why it is not a directory that only this
    user can write (it cannot be made, a symlink or no directory, another uid's, group- or
    other-writable), None when it is. Anyone may make that name first in a shared /tmp; the check
    is on the opened directory (O_NOFOLLOW), not on a name a symlink could redirect."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:  # e.g. the parent is another user's
        return f"cannot create {path} ({e.strerror})"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:  # a symlink (ELOOP), a file (ENOTDIR), another user's 0700 directory (EACCES)
        try:
            d = os.lstat(path)
        except OSError:
            return f"cannot open {path} ({e.strerror})"
        return _not_private(path, d) or f"cannot open {path} ({e.strerror})"
    try:
        d = os.fstat(fd)
    finally:
        os.close(fd)
    return _not_private(path, d)


def _not_private(path: Path, d: os.stat_result) -> str | None:
    me = os.getuid()
    if not stat.S_ISDIR(d.st_mode):
        return f"{path} is not a directory"
    if d.st_uid != me:
        return f"{path} belongs to uid {d.st_uid}, not to this job's uid {me}"
    if d.st_mode & GROUP_OTHER_WRITE:
        return f"{path} is group- or other-writable (mode {stat.S_IMODE(d.st_mode):o})"
    return None

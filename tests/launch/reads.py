"""Count the reads of files by every process on this machine (Slurm tasks in their own mount namespaces
included): Linux fanotify reports each read-only open when it is closed (FAN_CLOSE_NOWRITE), with the
file itself, so the count is the kernel's, not what the reader says it did. Needs root (CAP_SYS_ADMIN)."""

from __future__ import annotations

import ctypes
import os
import struct
from collections import Counter
from pathlib import Path

FAN_CLASS_NOTIF, FAN_CLOEXEC, FAN_NONBLOCK = 0, 1, 2
FAN_MARK_ADD, FAN_CLOSE_NOWRITE, FAN_EVENT_ON_CHILD = 1, 0x10, 0x08000000
AT_FDCWD = -100
EVENT = struct.Struct("IBBHQii")  # struct fanotify_event_metadata: len, vers, reserved, metadata_len, mask, fd, pid

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]


def available() -> str | None:
    """Why reads cannot be counted here, or None."""
    fd = _libc.fanotify_init(FAN_CLOEXEC | FAN_CLASS_NOTIF | FAN_NONBLOCK, os.O_RDONLY)
    if fd < 0:
        return f"fanotify_init: {os.strerror(ctypes.get_errno())} (needs root)"
    os.close(fd)
    return None


class Reads:
    """Read-only opens, by file (device, inode), of the files and the directories' children marked."""

    def __init__(self, *paths: Path):
        self.fd = _libc.fanotify_init(FAN_CLOEXEC | FAN_CLASS_NOTIF | FAN_NONBLOCK, os.O_RDONLY)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "fanotify_init")
        self.counts: Counter = Counter()
        for p in paths:
            mask = FAN_CLOSE_NOWRITE | (FAN_EVENT_ON_CHILD if p.is_dir() else 0)
            if _libc.fanotify_mark(self.fd, FAN_MARK_ADD, mask, AT_FDCWD, str(p).encode()) < 0:
                raise OSError(ctypes.get_errno(), f"fanotify_mark {p}")

    def drain(self) -> None:
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            while buf:
                length, _, _, _, _, fd, _ = EVENT.unpack_from(buf)
                if fd >= 0:
                    st = os.fstat(fd)
                    self.counts[(st.st_dev, st.st_ino)] += 1
                    os.close(fd)
                buf = buf[length:]

    def take(self, path: Path) -> int:
        """The reads of `path` since the last take (events read now), then forgotten."""
        self.drain()
        st = path.stat()
        return self.counts.pop((st.st_dev, st.st_ino), 0)

    def close(self) -> None:
        os.close(self.fd)

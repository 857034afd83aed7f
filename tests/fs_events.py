"""Metadata operations under a directory tree as a parallel file system's metadata server sees them:
inotify(7) through ctypes (no package), for the tests and bench/site_load.py that count what hpctrain
costs the shared file system. Creates, deletes, renames, opens and attribute changes are events; a
stat is not (inotify has no event for it): count those by wrapping the code that makes them."""

from __future__ import annotations

import ctypes
import os
import struct
import threading
import time
from pathlib import Path

IN_MODIFY, IN_ATTRIB, IN_OPEN = 0x2, 0x4, 0x20
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_ISDIR = 0x40000000
METADATA = {IN_CREATE: "create", IN_DELETE: "delete", IN_MOVED_FROM: "rename", IN_OPEN: "open", IN_ATTRIB: "attrib"}
EVENT = struct.Struct("iIII")


class Inotify:
    """Metadata events under a directory tree (inotify(7)), recorded as (time, op, path)."""

    def __init__(self, top: Path) -> None:
        self.libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.dirs: dict[int, Path] = {}
        self.events: list[tuple[float, str, str]] = []
        self.stop = threading.Event()
        self.top = top
        self.watch(top)
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def watch(self, d: Path) -> None:
        mask = IN_MODIFY | IN_ATTRIB | IN_OPEN | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
        wd = self.libc.inotify_add_watch(self.fd, str(d).encode(), mask)
        if wd >= 0:
            self.dirs[wd] = d
            for sub in d.iterdir() if d.is_dir() else ():
                if sub.is_dir() and not sub.is_symlink():
                    self.watch(sub)

    def loop(self) -> None:
        while not self.stop.is_set():
            if not self.drain():
                time.sleep(0.05)
        self.drain()

    def drain(self) -> bool:
        """Record the events waiting to be read; whether there were any."""
        try:
            buf = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return False
        now, i = time.time(), 0
        while i < len(buf):
            wd, mask, _, n = EVENT.unpack_from(buf, i)
            name = buf[i + EVENT.size : i + EVENT.size + n].rstrip(b"\0").decode(errors="replace")
            i += EVENT.size + n
            path = self.dirs.get(wd, self.top) / name
            if mask & IN_CREATE and mask & IN_ISDIR:
                self.watch(path)
            for bit, op in METADATA.items():
                if mask & bit:
                    self.events.append((now, op, str(path.relative_to(self.top))))
        return True

    def close(self) -> list[tuple[float, str, str]]:
        self.stop.set()
        self.thread.join()
        os.close(self.fd)
        return self.events

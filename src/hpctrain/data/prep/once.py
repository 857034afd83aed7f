"""Make something once per file system, whoever asks: a lock to wait on and a marker when done.

Several ranks (or jobs) may need the same dataset folder or staged copy; the first one to take
the lock makes it and writes the marker, the others block on the lock and then see the marker.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Callable
from pathlib import Path


def make_once(done: Path, lock: Path, make: Callable[[], str]) -> bool:
    """Run `make` unless `done` exists; True when this process made it (`make` returns the marker text)."""
    if done.exists():
        return False
    created = [d for d in (lock.parent, *lock.parent.parents) if not d.exists()]  # innermost first
    lock.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(lock, "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # the others wait here while one process makes it
            if done.exists():
                return False
            text = make()
            done.write_text(text)
    except BaseException:
        if created and not done.exists():  # a first try that failed (a missing package, Ctrl-C) leaves no folder
            lock.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                for d in created:
                    d.rmdir()  # only while nothing else was written there
        raise
    return True

"""Make something once per file system, whoever asks: a lock to wait on and a marker when done.

Several ranks (or jobs) may need the same dataset folder or staged copy; the first one to take
the lock makes it and writes the marker, the others block on the lock and then see the marker.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable
from pathlib import Path


def make_once(done: Path, lock: Path, make: Callable[[], str]) -> bool:
    """Run `make` unless `done` exists; True when this process made it (`make` returns the marker text)."""
    if done.exists():
        return False
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # the others wait here while one process makes it
        if done.exists():
            return False
        text = make()
        done.write_text(text)
    return True

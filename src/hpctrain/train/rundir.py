"""The run directory is owned by one job at a time: an advisory lock held for the job's life.

The lock is a POSIX record lock (`lockf`) on `<run>/.lock`: the kernel drops it when the holder
dies (even by SIGKILL), so a requeued or restarted job takes it over, while a second live job
pointed at the same run directory is refused before it writes anything. Unlike flock, it is not
inherited by forked loader workers (which would keep it past the run), and it works over NFS.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from hpctrain.errors import UserError


class RunDirBusy(UserError, RuntimeError):
    """Another live job holds the run directory."""


class RunLock:
    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / ".lock"
        self._f = None

    def acquire(self) -> str | None:
        """Take the lock; returns None, or a description of the current holder."""
        f = open(self.path, "a+")  # noqa: SIM115 - held open for the life of the job
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            return holder
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                            "slurm_job": os.environ.get("SLURM_JOB_ID"), "since": time.strftime("%FT%T")}))
        f.flush()
        self._f = f
        return None

    def release(self) -> None:
        if self._f:
            self._f.close()
            self._f = None

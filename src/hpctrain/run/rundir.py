"""The run directory is owned by one job at a time: an advisory lock held for the job's life.

The lock is a POSIX record lock (`lockf`) on `<run>/.lock`: the kernel drops it when the holder
dies (even by SIGKILL), so a requeued or restarted job takes it over, while a second live job
pointed at the same run directory is refused before it writes anything. Unlike flock, it is not
inherited by forked loader workers (which would keep it past the run).

Shared file systems bend both halves of that:
- Lustre mounted `noflock` answers ENOSYS, NFS without lockd ENOLCK (some file systems
  EOPNOTSUPP): no lock can be had at all. Refusing would refuse every job on that file system,
  so the job goes on without the lock and says, once, what is then unprotected.
- A network lock lives in a lock server: after a NODE_FAIL it outlives the dead node until the
  server notices (an NFS lease, a Lustre client eviction), while Slurm has already requeued the
  job. The lock file records its holder's Slurm job and restart count; a later run of the same
  job (higher `SLURM_RESTART_COUNT`) takes the stale lock over instead of being refused. So does
  a later step of the same job run after a node failed (hot spares: higher `HPCTRAIN_ATTEMPT`).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from hpctrain.errors import UserError
from hpctrain.run.layout import LOCK

HELD = (errno.EAGAIN, errno.EACCES)  # POSIX allows either for a lock held by someone else
NO_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP)  # the file system refuses locks (ENOTSUP too)


def attempt_of(env: Mapping[str, str]) -> int:
    """The batch shell's step attempt in this job run (HPCTRAIN_ATTEMPT; 0 when unset). Here, not
    in train.dist (which reads it too): the lock records it, and run/ imports nothing of train/."""
    a = env.get("HPCTRAIN_ATTEMPT", "")
    return int(a) if a.isdigit() else 0


class RunDirBusy(UserError, RuntimeError):
    """Another live job holds the run directory."""


def holder_record(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What the lock file says about its holder: enough to name it, and to recognise a later run
    of the same Slurm job."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID") or None
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "slurm_job": job,
        "slurm_restart": int(env.get("SLURM_RESTART_COUNT") or 0) if job else None,
        "attempt": attempt_of(env) if job else None,
        "since": time.strftime("%FT%T"),
    }


def parse_record(text: str) -> dict[str, Any]:
    """The holder record in a lock file; {} when it is empty or not ours."""
    try:
        rec = json.loads(text)
    except ValueError:
        return {}
    return rec if isinstance(rec, dict) else {}


def earlier_run_of_this_job(holder: Mapping[str, Any], me: Mapping[str, Any]) -> bool:
    """Is the holder this Slurm job's own earlier run (before a requeue), whose lock outlived it?

    Only a higher restart count says so: Slurm counts every requeue (node failure, time limit,
    preemption, `scontrol requeue`) in SLURM_RESTART_COUNT, so an earlier run always has a lower
    one; within a run, the batch shell's attempt (a step started again on spare nodes). Another
    step of the same run and attempt is a second writer, and is refused.
    """
    job = me.get("slurm_job")
    if not job or str(holder.get("slurm_job")) != str(job):
        return False
    try:
        return (int(me.get("slurm_restart") or 0), int(me.get("attempt") or 0)) > (
            int(holder.get("slurm_restart") or 0),
            int(holder.get("attempt") or 0),
        )
    except (TypeError, ValueError):
        return False


class RunLock:
    def __init__(self, run_dir: Path, env: Mapping[str, str] | None = None):
        self.path = Path(run_dir) / LOCK
        self.env = os.environ if env is None else env
        self.note: str | None = None  # a warning for the run's log: no lock, or a stale one taken over
        self._f: IO[str] | None = None

    def acquire(self) -> str | None:
        """Take the lock; returns None (this job owns the run directory), or a description of the
        current holder. `note` says when it went on without a lock or took a stale one over."""
        f = open(self.path, "a+")  # noqa: SIM115 - held open for the life of the job
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            f.seek(0)
            holder = f.read().strip()
            if e.errno in NO_LOCKS:
                self.note = self._unlocked_note(e, holder)
                self._own(f)
                return None
            f.close()
            if e.errno not in HELD:
                return f"an unknown holder (locking {self.path} failed: {os.strerror(e.errno or 0)})"
            me = holder_record(self.env)
            if earlier_run_of_this_job(parse_record(holder), me):
                return self._take_over(holder, me)
            return holder or "another process"
        self._own(f)
        return None

    def _own(self, f: IO[str], rec: dict[str, Any] | None = None) -> None:
        f.seek(0)
        f.truncate()
        f.write(json.dumps(rec or holder_record(self.env)))
        f.flush()
        self._f = f

    def _unlocked_note(self, e: OSError, holder: str) -> str:
        last = f"; last holder recorded: {holder}" if holder else ""
        return (
            f"run directory {self.path.parent}: its file system refuses locks "
            f"({errno.errorcode.get(e.errno or 0, e.errno)}: {os.strerror(e.errno or 0)}; Lustre mounted "
            "noflock or NFS without lockd?); going on without the lock, so a second job pointed at this "
            f"run directory would not be refused and both would write it{last}"
        )

    def _take_over(self, holder: str, me: dict[str, Any]) -> str | None:
        """Lock a new lock file and rename it over the stale one: POSIX locks belong to the file
        (inode), so the stale lock stays on the unlinked old file, and `.lock` is locked at every
        moment, by the stale holder until the rename and by this job after it."""
        tmp = self.path.with_name(f"{self.path.name}.{me['host']}.{me['pid']}")
        f = open(tmp, "w+")  # noqa: SIM115 - held open for the life of the job
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            f.close()
            tmp.unlink(missing_ok=True)
            return f"{holder} (taking the stale lock over failed: {os.strerror(e.errno or 0)})"
        self._own(f, me)
        os.replace(tmp, self.path)
        self.note = (
            f"run directory {self.path.parent}: took over the lock held by this job's earlier run "
            f"{holder} (this is restart {me['slurm_restart']} of job {me['slurm_job']}; a lock server "
            "kept that run's lock after its node failed)"
        )
        return None

    def release(self) -> None:
        if self._f:
            self._f.close()
            self._f = None

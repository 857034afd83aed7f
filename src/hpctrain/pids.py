"""Whether a process lives on this host, by its pid.

Below both `launch/` (a local job's controller and tasks: launch.localjob) and `watch/` (a run is
RUNNING while its lock holder or its local job lives: watch.jobinfo), which import it.
"""

from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int) -> bool:
    """The process exists (on this host) and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    try:  # a child that exited but was not reaped yet is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True

"""Small JSON answers kept on the login node between commands, so that `hpctrain submit` does not
ask Slurm's daemons the same heavy question every time (the partition's 30-day sacct history is a
slurmdbd query over every user's jobs).

Where: $XDG_CACHE_HOME/hpctrain, else ~/.cache/hpctrain (XDG Base Directory Specification), a
0700 directory of 0600 files: a site's job history is the user's to see, not the node's. A file is
written atomically (run.layout.atomic_write: a reader sees the old one or the new one) and used
only while younger than the caller's age limit; an unreadable, foreign or malformed file counts as
absent, and a cache that cannot be written is skipped: the cache only ever saves a query.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import IO, Any

from hpctrain.run.layout import atomic_write


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/hpctrain, else ~/.cache/hpctrain."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hpctrain"


def entry_name(kind: str, *key: str) -> str:
    """A file name for `kind` and its key parts (anything but [A-Za-z0-9._-] becomes _)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", "--".join((kind, *key))) + ".json"


def read(name: str, max_age_s: float) -> tuple[dict[str, Any], float] | None:
    """(the entry, when it was written, epoch seconds) while younger than `max_age_s`; None when
    missing, older, not the user's own, or unreadable."""
    path = cache_dir() / name
    try:
        st = path.stat()
        if st.st_uid != os.getuid() or not 0 <= time.time() - st.st_mtime <= max_age_s:
            return None
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return (data, st.st_mtime) if isinstance(data, dict) else None


def write(name: str, data: dict[str, Any]) -> None:
    """Store `data` as `name`, owner-only, atomically; a failure to write is no error (see above)."""
    text = json.dumps(data).encode()

    def owner_only(f: IO[bytes]) -> None:
        os.fchmod(f.fileno(), 0o600)  # before a byte is written
        f.write(text)

    directory = cache_dir()
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write(directory / name, owner_only)
    except OSError:
        return

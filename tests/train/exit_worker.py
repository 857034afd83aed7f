"""Test worker: `hpctrain train`'s entry on this rank, then report the threads left in the process
(Linux: /proc/self/task) as JSON on the last line of stdout, and exit through the interpreter's
normal finalization (the path that aborted once on torch 2.2)."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

from hpctrain.config import load
from hpctrain.train import entry


def main(config: str, *sets: str) -> None:
    summary = entry.run(load(config, list(sets)))
    names = sorted((t / "comm").read_text().strip() for t in Path("/proc/self/task").iterdir())
    print(
        json.dumps(
            {"status": summary["status"], "threads": names, "python_threads": [t.name for t in threading.enumerate()]}
        ),
        flush=True,
    )


if __name__ == "__main__":
    main(*sys.argv[1:])

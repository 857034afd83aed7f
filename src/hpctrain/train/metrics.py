"""Where results go: `metrics.jsonl` (one JSON object per line), progress, a summary table."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("hpctrain")


class MetricsWriter:
    """Appends JSON lines (rank 0 only); a requeued job appends to the same file."""

    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else None
        self._f = open(self.path, "a", buffering=1) if self.path else None  # noqa: SIM115
        self.failed = False

    def write(self, kind: str, **fields: Any) -> None:
        if self._f:
            rec = {"kind": kind, "time": round(time.time(), 3), **fields}
            try:
                self._f.write(json.dumps(rec) + "\n")
            except OSError as e:  # a full disk loses metric lines, not the run (checkpoints decide)
                if not self.failed:
                    log.warning("cannot append to %s: %s; metrics are lost until there is space", self.path, e)
                self.failed = True

    def close(self) -> None:
        if self._f:
            with contextlib.suppress(OSError):
                self._f.close()
            self._f = None


def read_metrics(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a crash
    return out


class Progress:
    """One updating line on a terminal; plain lines in logs."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled
        self.tty = enabled and sys.stdout.isatty()

    def update(self, step: int, text: str) -> None:
        if not self.enabled:
            return
        line = f"step {step}/{self.total} ({100 * step / max(1, self.total):.0f}%) {text}"
        if self.tty:
            sys.stdout.write("\r" + line[:160].ljust(100))
            sys.stdout.flush()
        else:
            print(line, flush=True)

    def newline(self) -> None:
        if self.tty:
            sys.stdout.write("\n")


def table(rows: list[tuple[str, str]], title: str = "") -> str:
    w = max(len(k) for k, _ in rows)
    lines = [title] if title else []
    lines += [f"  {k.ljust(w)}  {v}" for k, v in rows]
    return "\n".join(lines)

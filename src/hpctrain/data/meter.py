"""A progress line for long data jobs (packing, decode checks, staging): items, bytes, MB/s.

On a terminal the line is rewritten in place; in a log (a Slurm output file, a rank log) it is a
plain line at most every `every_s` seconds, so a stuck or slow job shows how far it got without
flooding the file. The last line always says the totals and the mean throughput.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

MB = 1e6  # throughput in decimal megabytes per second, as `dd` and most storage sheets quote it


def fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


class Meter:
    """Count `items` (and bytes) done of a known total; `log` takes one line (print, logger.info)."""

    def __init__(
        self,
        what: str,
        total: int,
        unit: str = "files",
        total_bytes: int = 0,
        log: Callable[[str], object] = print,
        every_s: float = 5.0,
        tty: bool | None = None,
    ):
        self.what, self.total, self.unit, self.total_bytes = what, total, unit, total_bytes
        self.log, self.every_s = log, every_s
        self.tty = (log is print and sys.stdout.isatty()) if tty is None else tty
        self.items = self.nbytes = 0
        self.t0 = self._last = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.t0

    def rate(self) -> float:
        """Mean MB/s since the start."""
        return self.nbytes / MB / max(self.seconds, 1e-9)

    def line(self) -> str:
        text = f"{self.what}: {self.items}/{self.total} {self.unit}"
        if self.total_bytes or self.nbytes:
            text += f", {fmt_bytes(self.nbytes)}"
            if self.total_bytes:
                text += f" of {fmt_bytes(self.total_bytes)}"
            text += f", {self.rate():.1f} MB/s"
        return text

    def add(self, items: int = 1, nbytes: int = 0) -> None:
        self.items += items
        self.nbytes += nbytes
        now = time.perf_counter()
        if self.tty:
            sys.stdout.write("\r" + self.line()[:160].ljust(80))
            sys.stdout.flush()
        elif now - self._last >= self.every_s and self.items < self.total:
            self.log(self.line())
            self._last = now

    def finish(self, text: str = "") -> str:
        """Log the final line (`text`, or the counts with the mean throughput) and return it."""
        if self.tty:
            sys.stdout.write("\n")
        line = text or f"{self.line()} in {self.seconds:.1f} s"
        self.log(line)
        return line

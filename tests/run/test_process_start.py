"""run/startup.py's `process` mark: when this process started, to a tick, not to btime's whole second."""

from __future__ import annotations

import subprocess
import sys
import time


def test_the_process_mark_falls_between_the_spawn_and_the_first_line():
    code = "import time; from hpctrain.run import startup; print(startup.process_start(), time.time())"
    before = time.time()
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    started, now = float(out[0]), float(out[1])
    tick = 0.011  # /proc's clock ticks (USER_HZ 100) and /proc/uptime's hundredths
    assert before - tick <= started <= now, (before, started, now)

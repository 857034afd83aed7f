"""How busy each xdist worker was, so that the pass's wall time can be read from its tests.

With `-n 3 --dist loadgroup` (.ci/run) the pass lasts as long as its busiest worker, and every Slurm 22.05 test
runs in one worker (one test cluster per session, tests/conftest.py). Cutting a test shortens the
pass only if it runs on the busiest worker: this summary, printed after `--durations`, says which
worker that was and what its time went to (each xdist group: `slurm`, `slurm24`, the rest).
"""

from __future__ import annotations

from collections import defaultdict

import pytest

_busy: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))


def _group(nodeid: str) -> str:
    """The xdist group of a test id (`…@slurm`, `…@module-x`): the Slurm ones by name, the rest as one."""
    group = nodeid.rpartition("@")[2] if "@" in nodeid else ""
    return group if group in ("slurm", "slurm24") else "other"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)  # the worker that ran it: set by xdist in the controller only
    if node is not None:
        _busy[node.gateway.id][_group(report.nodeid)] += report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    if not _busy:
        return
    terminalreporter.write_sep("=", "time per worker (setup + call + teardown; the busiest sets the wall time)")
    for worker, groups in sorted(_busy.items(), key=lambda kv: -sum(kv[1].values())):
        parts = ", ".join(f"{name} {s:.0f} s" for name, s in sorted(groups.items(), key=lambda kv: -kv[1]))
        terminalreporter.write_line(f"{worker}: {sum(groups.values()):.0f} s ({parts})")

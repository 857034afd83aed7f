"""No test depends on the working directory or writes into the checkout.

A test that ran `hpctrain submit` from the checkout without `run.dir`/`data.root` wrote `runs/` and
`data/` there, and a user's earlier demo run (README command 1, then the tests) changed what it saw:
the suite passed or failed by what the checkout held. So every test starts in an empty directory of
its own (`elsewhere`), and each test's teardown compares the checkout before and after the test and
fails the test that added or removed a file there, or changed one under runs/ or data/ (where a
run writes); the session does the same once more at its end (a file left by a background process
after its test).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Written by tools, not by tests: caches, build metadata, README command 1's virtual environment and .ci/run's,
# and the logs .ci/run's background jobs append to while the tests run.
IGNORED_DIRS = {
    ".git",
    ".venv",
    ".ci-venv",  # .ci/run's own, the suite's Python
    "__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    ".hypothesis",
    ".benchmarks",
}
IGNORED_SUFFIXES = (".pyc", ".egg-info")
CI_LOGS = (".ci-", ".log")  # .ci-<pass>.log
# Only the directories of these are compared (their files are many and never rewritten in place).
DIRS_ONLY = {ROOT / "data"}


def _ignored(name: str) -> bool:
    return (
        name in IGNORED_DIRS
        or name.endswith(IGNORED_SUFFIXES)
        or (name.startswith(CI_LOGS[0]) and name.endswith(CI_LOGS[1]))
    )


def snapshot(root: Path = ROOT) -> dict[str, tuple[int, int]]:
    """Path → (size, mtime_ns) of every file of the checkout that a test could write, and every
    directory (by name alone: a tool's cache appearing in it moves its mtime); under data/ the
    directories alone (their files are many and never rewritten in place)."""
    state: dict[str, tuple[int, int]] = {}
    for top, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not _ignored(d)]
        here = Path(top)
        state[str(here.relative_to(root)) + "/"] = (0, 0)
        if any(here == d or d in here.parents for d in DIRS_ONLY):
            continue
        for name in files:
            if _ignored(name):
                continue
            try:
                st = (here / name).stat()
            except FileNotFoundError:
                continue
            state[str((here / name).relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return state


# Where hpctrain writes by default (run.dir, data.root): a change to a file there is a test's doing.
# Elsewhere only an added or removed file is: tracked files change under a developer's edits, and
# other files under their owner's tools (a log that `bash .ci/run > ci.log` appends to).
WRITTEN_BY_RUNS = ("runs/", "data/")


def changes(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[str]:
    """'added X', 'removed X', 'changed X' (under runs/ or data/) for each difference, sorted."""
    out = [f"added {p}" for p in after.keys() - before.keys()]
    out += [f"removed {p}" for p in before.keys() - after.keys()]
    out += [
        f"changed {p}" for p in before.keys() & after.keys() if before[p] != after[p] and p.startswith(WRITTEN_BY_RUNS)
    ]
    return sorted(out)


@pytest.fixture(autouse=True)
def elsewhere(tmp_path_factory, monkeypatch):
    """Every test starts in an empty directory of its own, as a user who runs hpctrain from their
    project directory: a command or a relative path that assumed the checkout fails here."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.fixture(autouse=True)
def checkout_unchanged(request):
    """Fails the test (at teardown) that wrote into the checkout, naming what it wrote."""
    before = snapshot()
    yield
    diff = changes(before, snapshot())
    if diff:
        shown = "; ".join(diff[:8]) + (f"; … {len(diff) - 8} more" if len(diff) > 8 else "")
        pytest.fail(
            f"{request.node.nodeid} wrote into the checkout {ROOT} (or a test running beside it in "
            f"another worker did): {shown}. Run commands in tmp_path, or pass run.dir/data.root",
            pytrace=False,
        )


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # the controller (or a run without xdist)
        session.config._checkout_start = snapshot()


def pytest_sessionfinish(session, exitstatus):
    start = getattr(session.config, "_checkout_start", None)
    if start is None:
        return
    diff = changes(start, snapshot())
    if diff:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        msg = f"the test session wrote into the checkout {ROOT}: " + "; ".join(diff[:20])
        if reporter:
            reporter.write_line(msg, red=True)
        else:
            print(msg)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

"""Test worker: `python fsops_worker.py <dir> -m hpctrain ...` runs hpctrain in this process and
records every metadata operation any of its threads makes on a path under <dir>: opens (creating or
not), renames (os.rename, os.replace), unlinks, mkdirs, rmdirs, directory listings (Python's audit
events: what the code really calls, torch.save and the logging handlers included) and stats (os.stat,
os.lstat: Path.exists, is_file; they raise no audit event, so they are wrapped). Written at exit to
$HPCTRAIN_TEST_FSOPS_OUT as one JSON line per operation: {"t": wall time, "op", "path", "thread"}
(tests/train/health/test_fs_budget.py)."""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import threading
import time

ROOT = os.path.realpath(sys.argv[1]) + os.sep
OUT = os.environ["HPCTRAIN_TEST_FSOPS_OUT"]
EVENTS: list[tuple[float, str, str, str]] = []
AUDITED = {
    "os.rename": "rename",
    "os.remove": "unlink",
    "os.mkdir": "mkdir",
    "os.rmdir": "rmdir",
    "os.scandir": "list",
    "os.listdir": "list",
}


def note(op: str, path: object) -> None:
    if isinstance(path, int):  # an open file descriptor: no lookup by name
        return
    try:
        p = os.path.abspath(os.fsdecode(path))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return
    if p.startswith(ROOT):
        EVENTS.append((time.time(), op, p, threading.current_thread().name))


def hook(event: str, args: tuple) -> None:
    if event == "open":
        path, mode, flags = args
        creates = (isinstance(mode, str) and any(c in mode for c in "wax")) or bool((flags or 0) & os.O_CREAT)
        note("create" if creates else "open", path)
    elif event in AUDITED and args:
        note(AUDITED[event], args[0])


def wrapped(fn):
    def stat(path, *a, **k):
        note("stat", path)
        return fn(path, *a, **k)

    return stat


def dump() -> None:
    with open(OUT, "w") as f:
        for t, op, path, thread in list(EVENTS):
            f.write(json.dumps({"t": t, "op": op, "path": path, "thread": thread}) + "\n")


os.stat, os.lstat = wrapped(os.stat), wrapped(os.lstat)
sys.addaudithook(hook)
atexit.register(dump)
assert sys.argv[2:4] == ["-m", "hpctrain"], sys.argv
sys.argv = ["hpctrain", *sys.argv[4:]]
runpy.run_module("hpctrain", run_name="__main__", alter_sys=True)

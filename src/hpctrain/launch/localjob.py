"""The processes of a local job (submitit's local executor) and how a Ctrl-C reaches them.

submitit starts a controller process (its pid is the job id) that starts one process per task
and, when it is itself interrupted, sends the tasks SIGINT and then SIGKILL one second later
(`submitit.local.local.Controller.kill_tasks`): too soon for a checkpoint. A terminal's Ctrl-C
goes to the whole foreground process group, so by default the controller and the tasks would
get it along with `hpctrain submit`. Instead:

- the controller is started with SIGINT ignored (an ignored signal stays ignored across exec,
  and Python then installs no KeyboardInterrupt handler), so it never kills its tasks early;
- each task moves to its own process group as it starts (before its SIGINT handler exists it
  inherits the ignore), and leaves its pid in `<submitit folder>/<job id>_<rank>_task.json`
  once its stop handlers are installed;
- `hpctrain submit` catches the Ctrl-C and forwards exactly one SIGINT to each task: every rank
  stops at the next step, checkpoints, writes its stop record and exits (train.stop). A second
  Ctrl-C kills them at once. A hangup (the terminal closed: the shell sends SIGHUP to its jobs,
  which the tasks in their own groups are not) or a SIGTERM of the submitter counts as a Ctrl-C,
  so the tasks never outlive it unseen.

Linux and macOS both keep ignored signals across exec (POSIX execve).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hpctrain.pids import alive


def pid_path(folder: Path, job_id: str, rank: int) -> Path:
    return Path(folder) / f"{job_id}_{rank}_task.json"


def task_started(folder: Path, job_id: str, rank: int) -> None:
    """In a task of a local job, once its stop handlers are installed: its own process group (a
    terminal's Ctrl-C reaches the submitter only, which forwards it once) and its pid on record."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "local":
        return
    with contextlib.suppress(OSError):  # already a group or session leader: nothing to leave
        os.setpgid(0, 0)
    path = pid_path(folder, job_id, rank)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "rank": rank}) + "\n")
    os.replace(tmp, path)


def task_pids(folder: Path, job_id: str) -> list[int]:
    """Pids of the job's tasks on this host that are still alive."""
    host, out = socket.gethostname(), []
    for p in sorted(Path(folder).glob(f"{job_id}_*_task.json")):
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if rec.get("host") == host and isinstance(rec.get("pid"), int) and alive(rec["pid"]):
            out.append(rec["pid"])
    return out


def signal_tasks(folder: Path, job_id: str, sig: int) -> list[int]:
    """Send `sig` to every live task of the job; the pids signalled."""
    sent = []
    for pid in task_pids(folder, job_id):
        try:
            os.kill(pid, sig)
            sent.append(pid)
        except ProcessLookupError:
            pass
    return sent


class Signalled(KeyboardInterrupt):
    """A SIGHUP or SIGTERM of the submitter, taken as a Ctrl-C (HangupAsInterrupt); `name` says which."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _interrupt(signum: int, frame) -> None:
    raise Signalled(signal.Signals(signum).name)


def signal_name(e: KeyboardInterrupt) -> str:
    """The signal behind an interrupt: SIGHUP or SIGTERM (Signalled), else SIGINT (a Ctrl-C)."""
    return e.name if isinstance(e, Signalled) else "SIGINT"


def take_sigint() -> None:
    """A job run in the foreground stops on SIGINT even when this process was started with it
    ignored (bash starts a non-interactive shell's background jobs so, and an ignored signal stays
    ignored across exec): Python's KeyboardInterrupt handler back (main thread only)."""
    with contextlib.suppress(ValueError):  # not the main thread
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)


class HangupAsInterrupt:
    """`with HangupAsInterrupt():` while the submitter waits for its local job, SIGHUP and SIGTERM
    raise KeyboardInterrupt like a Ctrl-C, so they stop the tasks too (main thread only; elsewhere
    nothing changes). The old handlers come back on exit."""

    def __enter__(self) -> HangupAsInterrupt:
        self.old = {}
        for sig in (signal.SIGHUP, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread
                self.old[sig] = signal.signal(sig, _interrupt)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.old.items():
            signal.signal(sig, handler)


def say(text: str) -> None:
    """A line on stderr; nothing when the terminal is gone (after a hangup)."""
    with contextlib.suppress(OSError):
        print(text, file=sys.stderr, flush=True)


def stop_tasks(
    done: Callable[[], bool],
    folder: Path,
    job_id: str,
    what: str = "stops at the next step (checkpoint, stop record)",
    by: str = "SIGINT",
) -> None:
    """After a Ctrl-C of the submitter (`by`: or the SIGTERM, SIGHUP taken as one): one SIGINT to
    each task (a task that records its pid later gets its own once it can take it), then wait until
    the job is `done()`. A second Ctrl-C, SIGTERM or SIGHUP kills the tasks (SIGKILL) and raises
    KeyboardInterrupt."""
    got, again = ("interrupted", "Ctrl-C again") if by == "SIGINT" else (f"got {by}", f"{by} again (or Ctrl-C)")
    say(f"\nhpctrain: {got}: local job {job_id} {what}; {again} to kill it now")
    signalled: set[int] = set()
    try:
        while not done():  # a second SIGINT would make a task exit at once: once per pid
            for pid in set(task_pids(folder, job_id)) - signalled:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGINT)
                signalled.add(pid)
            time.sleep(0.2)
    except KeyboardInterrupt:
        killed = signal_tasks(folder, job_id, signal.SIGKILL)
        say(f"hpctrain: killed local job {job_id} ({len(killed)} processes): nothing since its last checkpoint is kept")
        raise


class IgnoreSigint:
    """`with IgnoreSigint():` children started inside ignore SIGINT (main thread only; elsewhere
    signal handlers cannot change and nothing is done)."""

    def __enter__(self) -> IgnoreSigint:
        try:
            self.old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        except ValueError:  # not the main thread
            self.old = None
        return self

    def __exit__(self, *exc) -> None:
        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)

"""Why a submitted job failed, said on the submitting machine in one line.

submitit hands a task's exception back as a `FailedJobError` wrapping the task's traceback (two
tracebacks, ~60 lines), even for a `UserError` — a missing checkpoint, a busy run directory —
whose message is all the user needs. So the task (launch.task) writes what a UserError said (class
and message, JSON) to `<submitit folder>/<job id>_<rank>_error.json` before re-raising it (the
job still fails: Slurm marks it FAILED), and the submitter reads that record: nothing is
unpickled, so the login node needs none of the task's (torch-bound) exception classes. A crash
(any other exception) leaves no record: its traceback, which submitit pickles as a plain string
in `<job id>_<rank>_result.pkl`, is shown with the log path.

Under an hpctrain batch script every error also leaves a crash line (`crash_line`) for the shell,
which restarts a step that failed on healthy nodes unless the error is the user's to fix or came
back at the same step (launch/shell/restarts.sh); an error that names its node (an uncorrectable
ECC error, an Xid: `badnodes.report_error`) also names the node, which the next step leaves out.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from hpctrain.errors import UserError, step_of
from hpctrain.run import badnodes
from hpctrain.run.badnodes import this_node
from hpctrain.run.layout import append_line, atomic_write

CRASH_ENV = "HPCTRAIN_CRASH_FILE"


class JobFailed(UserError):
    """A submitted job ended in an error; `detail` (a crash's traceback) is printed above the line."""

    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.detail = detail


def record_path(folder: Path, job_id: str, rank: int) -> Path:
    return Path(folder) / f"{job_id}_{rank}_error.json"


def log_path(folder: Path, job_id: str, rank: int) -> Path:
    """The task's stderr as submitit names it, locally and under srun (`%j_%t_log.err`)."""
    return Path(folder) / f"{job_id}_{rank}_log.err"


@contextmanager
def recorded(folder: Path, job_id: str, rank: int) -> Iterator[None]:
    """Around a task's work: a UserError leaves its record (then propagates); a stale record of an
    earlier attempt of this job (a requeue) is removed first. Any error also leaves its crash line
    for the batch shell (`crash_line`)."""
    path = record_path(folder, job_id, rank)
    path.unlink(missing_ok=True)
    try:
        yield
    except Exception as e:
        write_crash_line(rank, e)
        with contextlib.suppress(OSError, ValueError):  # the crash line above already says why
            badnodes.report_error(error_text(e), rank)
        if isinstance(e, UserError):
            atomic_write(path, json.dumps({"class": type(e).__name__, "message": str(e), "rank": rank}) + "\n")
        raise


def error_text(e: BaseException) -> str:
    """The error's class and the first line of its message, printable, at most 300 characters."""
    lines = str(e).strip().splitlines()
    error = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
    return "".join(c if c.isprintable() else " " for c in error)[:300]


def crash_line(rank: int, e: BaseException, node: str, now_ns: int) -> str:
    """What the batch shell reads of a failed rank (launch/shell/restarts.sh), tab-separated: time
    (ns, so that the first rank to fail sorts first), rank, node, the step the error stopped
    training in (`-` before training: bash's `read` merges empty tab-separated fields), `user` (a
    UserError that is not `transient`: a restart cannot fix it) or `crash`,
    and the error's class with the first line of its message."""
    error = error_text(e)
    step = step_of(e)
    kind = "user" if isinstance(e, UserError) and not e.transient else "crash"
    return f"{now_ns}\t{rank}\t{node}\t{'-' if step is None else step}\t{kind}\t{error}\n"


def write_crash_line(rank: int, e: BaseException, env: Mapping[str, str] | None = None) -> bool:
    """Append this rank's crash line to $HPCTRAIN_CRASH_FILE (set by the batch shell; none outside
    an hpctrain batch script: False). One O_APPEND write: lines of several ranks do not interleave."""
    env = os.environ if env is None else env
    path = env.get(CRASH_ENV)
    if not path:
        return False
    try:
        append_line(path, crash_line(rank, e, this_node(env), time.time_ns()), mode=0o600)
    except OSError:  # the shell then restarts without knowing why: it says so
        return False
    return True


def read_record(folder: Path, job_id: str) -> dict | None:
    """The lowest rank's UserError record of this job, if any."""
    found = []
    for p in Path(folder).glob(f"{job_id}_*_error.json"):
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("rank"), int) and rec.get("message"):
            found.append(rec)
    return min(found, key=lambda r: r["rank"]) if found else None


def crash_trace(folder: Path, job_id: str, tasks: int) -> tuple[int, str] | None:
    """(rank, traceback) of the lowest rank whose result is an error: submitit pickles
    ("error", traceback text), a tuple of strings."""
    for rank in range(tasks):
        p = Path(folder) / f"{job_id}_{rank}_result.pkl"
        try:
            with open(p, "rb") as f:
                outcome = pickle.load(f)
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
            continue
        if isinstance(outcome, tuple) and len(outcome) == 2 and outcome[0] == "error" and isinstance(outcome[1], str):
            return rank, outcome[1].rstrip()
    return None


def explain(folder: Path, job_id: str, tasks: int, what: str) -> JobFailed | None:
    """The error to raise for job `job_id` (`what`: e.g. "local job") that failed: the task's
    UserError as its one line, else a crash's traceback (as detail); None when its tasks left
    neither (killed, a stop that was not requeued: the caller says what it knows)."""
    rec = read_record(folder, job_id)
    if rec:
        return JobFailed(
            f"{rec['message']} ({what} {job_id}, rank {rec['rank']}; log: {log_path(folder, job_id, rec['rank'])})"
        )
    crash = crash_trace(folder, job_id, tasks)
    if crash:
        rank, trace = crash
        return JobFailed(
            f"{what} {job_id} crashed on rank {rank} (traceback above; log: {log_path(folder, job_id, rank)})",
            detail=trace,
        )
    return None


def no_result(folder: Path, job_id: str, what: str) -> JobFailed:
    """A job whose tasks left no result at all."""
    return JobFailed(
        f"{what} {job_id} ended without a result (a task was killed, or died): see its log "
        f"{log_path(folder, job_id, 0)}"
    )

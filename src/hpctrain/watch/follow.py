"""Following a Slurm job from the login node (`submit --wait`, `eval --wait`, `logs -f`) at a bounded
cost to the controller: at most 2 Slurm calls a minute on average over a 3-minute job, ~1 a minute after.

What the job is doing comes from its files first (progress from metrics.jsonl, the logs as they
grow), which cost no Slurm call. Slurm is asked only whether our job is still in the queue
(`squeue -j ID`, one line), at the times of a `Pace` that starts short, so that a quick failure shows
within seconds, and backs off to a minute; an ask is skipped while the run's files moved since the
last due time (the job is evidently alive), and the short gaps start again when the files say an
attempt ends (an `end` or `stop` record, an evaluation's summary). Once the job has left the queue,
its end state is read once (sacct; without accounting the controller's record: watch/jobinfo.py).

Facts (Slurm 22.05.8, measured on the test cluster; docs/launch.md, "Following a job"):
- `squeue -h -j ID -o %T` prints the state while the job is pending, running or completing (a
  requeued job: PENDING again); once it ended it prints nothing and exits 0 while slurmctld holds the
  job (MinJobAge, default 300 s), then fails with "slurm_load_jobs error: Invalid job id specified"
  (exit 1). So an empty answer or that error means "left the queue"; any other failure, no answer.
No torch: this runs on login nodes.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpctrain.errors import UserError
from hpctrain.run.layout import LOGS, METRICS, SUBMITIT
from hpctrain.site.slurm_cli import queue_field
from hpctrain.watch.jobinfo import job_state
from hpctrain.watch.progress import MetricsTail

# the states after which a job never runs again, unless Slurm requeues it
TERMINAL = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
)
# squeue's states of a job waiting for an allocation, a requeued one included (squeue(1), JOB STATE CODES)
WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING"})
FLOOR_S = 5.0  # the shortest --poll: one follower at 12 calls a minute
GAPS_S = (5.0, 10.0, 15.0)  # the first asks: 5, 15 and 30 s after following starts (or an attempt ends)
CAP_S = 60.0  # then one a minute
ENDING_KINDS = ("end", "stop")  # metrics records that end an attempt: the job ends or is requeued soon


@dataclass(frozen=True)
class Pace:
    """When a follower asks Slurm: `gaps_s` seconds apart at first, then every `cap_s`."""

    gaps_s: tuple[float, ...] = GAPS_S  # the first gaps (a quick failure shows quickly)
    cap_s: float = CAP_S  # every later gap

    def gap(self, n: int) -> float:
        """Seconds from the n-th due time (0: the start) to the next."""
        return self.gaps_s[n] if n < len(self.gaps_s) else self.cap_s

    def due_times(self, until_s: float) -> list[float]:
        """The due times (s after the start) up to `until_s`: at most that many asks."""
        out, t, n = [], self.gap(0), 0
        while t <= until_s:
            out.append(t)
            n += 1
            t += self.gap(n)
        return out


def add_poll_arg(p, follows: str) -> None:
    """`--poll S` on a command whose `follows` flag (--wait, -f) follows a Slurm job."""
    p.add_argument(
        "--poll",
        type=float,
        metavar="S",
        help=f"with {follows}: ask Slurm every S seconds (at least {FLOOR_S:g}; default: at 5, 15 and 30 s, then every "
        "minute: <= 2 calls a minute), and never while the run's files grow",
    )


def pace_of(poll_s: float | None, following: bool = True, follows: str = "--wait") -> Pace:
    """The default pace, or a fixed gap of `poll_s` (`--poll S`); a one-line UserError below FLOOR_S
    or without the `follows` flag."""
    if poll_s is None:
        return Pace()
    if not following:
        raise UserError(f"--poll sets how often {follows} asks Slurm: add {follows}, or drop --poll")
    if not math.isfinite(poll_s):
        raise UserError(f"--poll {poll_s}: not a number of seconds: give --poll {FLOOR_S:g} or more")
    if poll_s < FLOOR_S:
        raise UserError(
            f"--poll {poll_s:g}: below the floor of {FLOOR_S:g} s (each poll is a call to the Slurm controller, "
            f"shared by every user): give --poll {FLOOR_S:g} or more, or leave it out (5, 15, 30 s, then every minute)"
        )
    return Pace((), poll_s)


def queue_now(job_id: str) -> str | None:
    """Our job's state in the queue: squeue's word, "" once it left the queue, None: no answer."""
    line = queue_field(str(job_id), "%T")
    return None if line is None else (line.split() or [""])[0]


class Moved:
    """Whether any of the files changed (size, time, inode) since the last call: one stat each."""

    def __init__(self, paths: Sequence[Path]):
        self.paths = tuple(paths)
        self._seen: dict[Path, tuple[int, int, int] | None] = {}

    def __call__(self) -> bool:
        moved = False
        for p in self.paths:
            try:
                st = os.stat(p)
                now: tuple[int, int, int] | None = (st.st_size, st.st_mtime_ns, st.st_ino)
            except OSError:
                now = None
            if now != self._seen.get(p):
                moved = moved or now is not None
                self._seen[p] = now
        return moved


class Endings:
    """How many attempt ends (`end`, `stop` records) the run's metrics.jsonl holds, counted as it
    grows (`tail` is polled here: a second poll in the same tick reads nothing again)."""

    def __init__(self, tail: MetricsTail):
        self.tail, self._read, self._count = tail, 0, 0
        self._records: list[dict] | None = None

    def __call__(self) -> int:
        records = self.tail.poll()
        if records is not self._records or len(records) < self._read:  # the file was replaced: count again
            self._records, self._read, self._count = records, 0, 0
        self._count += sum(1 for r in records[self._read :] if r.get("kind") in ENDING_KINDS)
        self._read = len(records)
        return self._count


class JobEnd:
    """`ended()` for a follower's loop (called every tick): True once the job has ended for good.

    Asks `queue` only at the pace's due times, and skips a due ask when `moved()` saw the files move
    since the previous due time; a rise in `endings()` starts the short gaps again and asks at each
    until the queue says the job waits again (a requeue) or has left. A job that left the queue gets
    its end state from `final` (sacct once); one that is not TERMINAL (accounting that lags) keeps
    the wait going, but UNKNOWN (neither accounting nor the controller knows the job) ends it.
    `at_once`: the first ask is due at once (`logs -f` of a job that may have ended long ago), else
    one gap after the start. `state`: the last state learnt; `asks`: the calls made through `queue`."""

    def __init__(
        self,
        job_id: str,
        final: Callable[[], str],
        pace: Pace | None = None,
        moved: Callable[[], bool] = lambda: False,
        endings: Callable[[], int] = lambda: 0,
        queue: Callable[[str], str | None] = queue_now,
        clock: Callable[[], float] = time.monotonic,
        at_once: bool = False,
    ):
        self.job_id, self.final, self.pace = job_id, final, pace or Pace()
        self.moved, self.endings, self.queue, self.clock = moved, endings, queue, clock
        self.state, self.asks = "", 0
        self._n, self._due = 0, clock() + (0.0 if at_once else self.pace.gap(0))
        moved()  # what the files are now: only a later change counts
        self._seen_endings, self._closing = endings(), False

    def _restart(self, now: float) -> None:
        self._n, self._due = 0, now + self.pace.gap(0)

    def __call__(self) -> bool:
        now = self.clock()
        endings = self.endings()
        if endings > self._seen_endings:  # an attempt ends: the job ends or goes back to the queue soon
            self._closing = True
            self._restart(now)
        self._seen_endings = endings  # (fewer: the records were rewritten by a resume)
        if now < self._due:
            return False
        self._n += 1
        self._due = now + self.pace.gap(self._n)
        moved = self.moved()  # since the last due time: a stat of each file then, not every tick
        if moved and not self._closing:
            return False  # written to since the last due time: alive, no need to ask
        self.asks += 1
        q = self.queue(self.job_id)
        if q is None:  # no answer (controller busy or down): the next due time
            return False
        if q:  # still in the queue: pending, running, completing, or requeued
            self.state = q
            if q in WAITING:
                self._closing = False  # requeued: back to waiting on the files
            return False
        self.state = self.final()  # it left the queue: its end, read once
        if self.state in TERMINAL or self.state == "UNKNOWN":  # (UNKNOWN: no one knows it any more)
            return True
        self._closing = True  # accounting not there yet (slurmdbd lags the controller): soon again
        self._restart(now)
        return False


def run_files(run_dir: Path, job_id: str) -> list[Path]:
    """The files a Slurm job of the run writes to while it lives (watched at no Slurm cost): its
    metrics, rank 0's log, the batch shell's and rank 0's task output."""
    return [
        run_dir / METRICS,
        run_dir / LOGS / "rank-0.log",
        run_dir / SUBMITIT / f"{job_id}_0_log.out",
        run_dir / SUBMITIT / f"{job_id}_0_log.err",
    ]


def wait_job(
    job_id: str,
    pace: Pace | None = None,
    files: Sequence[Path] = (),
    done_file: Path | None = None,
    tick_s: float = 2.0,
) -> str:
    """Wait until the job has ended for good (a requeued job keeps it going): its end state. Slurm is
    asked at `pace` (JobEnd), not while `files` grow; `done_file` appearing (an evaluation's
    summary) asks sooner."""
    done = (lambda: int(done_file.exists())) if done_file else (lambda: 0)
    end = JobEnd(job_id, lambda: job_state(job_id), pace, Moved(files), done)
    while not end():
        time.sleep(tick_s)
    return end.state

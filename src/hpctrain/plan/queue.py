"""How long a job of N nodes waits in the partition's queue, from the cluster's own record (login
node: Slurm clients only, run and read by site/slurm_cli.py). Sources (facts and man pages:
docs/plan.md, "Queue"):

- history: `sacct -X -D -a -r P -S … -E now` (`slurm_cli.read_history`) — one row per allocation
  (-X), every attempt of a requeued job (-D), all users (-a); a job's wait is Start − Eligible.
  "Similar size" is the same power-of-two node bucket (1; 2-3; 4-7; 8-15; …) on the same
  partition; the estimate is the median over those that started, and "unknown" below MIN_JOBS of
  them. Jobs still pending are not counted (their wait is not over), so a long backlog makes the
  median low: the squeue line says how long the queue is now.
- now: `squeue --start` (pending jobs of the partition, their nodes and Slurm's expected start,
  which holds only under the backfill scheduler and is bounded by running jobs' time limits) and
  `sinfo -o %F` (allocated/idle/other/total nodes).
- requeue wait: a requeued job's next attempt starts (Start) after the previous one ended (End).

Read once and shared: a dry run, a sweep's members and the submission after them take the same
answers from the user's cache (slurm_cli `cache_s`, per cluster and partition): the queue now for
NOW_CACHE_S, the history for HISTORY_CACHE_S. The history is HISTORY_DAYS long (docs/plan.md,
"What a plan costs the site": a week holds each weekday's load once and halves the scan).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from datetime import datetime

from hpctrain.site.slurm_cli import Alloc, node_counts, pending_starts

MIN_JOBS = 5  # fewer similar jobs than this in the window: the wait is "unknown", not a median of noise
HISTORY_DAYS = 7.0  # the all-users sacct scan of a plan and a submission (a week: every weekday once)
# How long the answers are reused: pending jobs and idle nodes change within minutes, a week's waits
# and interruptions hardly in an hour (a job of the history ends every few minutes on a busy site).
NOW_CACHE_S = 600
HISTORY_CACHE_S = 3600


@dataclass(frozen=True)
class Figure:
    """A number of seconds and where it comes from; `seconds` None: unknown (the source says why)."""

    seconds: float | None
    source: str
    n: int = 0  # how many jobs (or events) it rests on

    @property
    def known(self) -> bool:
        return self.seconds is not None


@dataclass(frozen=True)
class History:
    """A partition's allocations over the last `days` (None: sacct did not answer)."""

    partition: str
    days: float
    allocs: tuple[Alloc, ...] | None

    def text(self) -> str:
        return f"sacct, partition {self.partition}, last {self.days:g} days"


def within(allocs: tuple[Alloc, ...] | None, days: float) -> tuple[Alloc, ...] | None:
    """The allocations of a longer scan that `sacct -S <now − days> -E now` lists too: those still
    running or ended inside the window (a job of the window's first hours that started before it
    included, as sacct lists it). One all-users scan then serves the queue's week and the MTBF's month."""
    if allocs is None:
        return None
    cutoff = datetime.fromtimestamp(datetime.now().timestamp() - days * 86400)
    return tuple(a for a in allocs if a.end is None or a.end >= cutoff)


@dataclass(frozen=True)
class Now:
    """The partition at this moment: sinfo's node counts and squeue's pending jobs."""

    allocated: int | None = None
    idle: int | None = None
    other: int | None = None
    total: int | None = None
    pending: tuple[tuple[int, datetime | None], ...] | None = None  # (nodes, expected start) per pending job

    def text(self, nodes: int) -> str:
        parts = []
        if self.total is not None:
            parts.append(
                f"sinfo: {self.idle} of {self.total} nodes idle, {self.allocated} allocated"
                + (f", {self.other} other (down/drained)" if self.other else "")
            )
        if self.pending is not None:
            similar = [s for n, s in self.pending if bucket(n) == bucket(nodes)]
            starts = [s for _, s in self.pending if s]
            latest = f"; Slurm expects the last to start at {max(starts):%Y-%m-%d %H:%M}" if starts else ""
            parts.append(
                f"squeue --start: {len(self.pending)} job(s) pending ({len(similar)} of {bucket_text(nodes)}){latest}"
            )
        return "; ".join(parts) if parts else "sinfo/squeue: no answer"


def bucket(nodes: int) -> int:
    """The power-of-two size class of a node count: 1 → 1, 2-3 → 2, 4-7 → 4, 8-15 → 8, …"""
    return 2 ** int(math.log2(max(1, nodes)))


def bucket_text(nodes: int) -> str:
    lo = bucket(nodes)
    return f"{lo} node" if lo == 1 else f"{lo}-{2 * lo - 1} nodes"


def started(a: Alloc) -> bool:
    """The allocation ran. sacct gives a job cancelled while pending Start = End = the cancel time
    (22.05, measured), with an Eligible that may even be later (a requeued attempt's BeginTime)."""
    return bool(a.start and a.eligible and a.start >= a.eligible and not (a.state == "CANCELLED" and not a.elapsed_s))


def waits(allocs, nodes: int) -> list[float]:
    """Start − Eligible, in seconds, of every allocation of `nodes`' size class that started."""
    return [(a.start - a.eligible).total_seconds() for a in allocs if started(a) and bucket(a.nodes) == bucket(nodes)]


def queue_wait(hist: History, nodes: int, min_jobs: int = MIN_JOBS) -> Figure:
    """The median wait of similar jobs in the history, or unknown with the reason."""
    if hist.allocs is None:
        return Figure(None, f"unknown: sacct does not answer for partition {hist.partition} (no Slurm accounting here)")
    w = waits(hist.allocs, nodes)
    what = f"jobs of {bucket_text(nodes)} that started ({hist.text()})"
    if len(w) < min_jobs:
        return Figure(None, f"unknown: {len(w)} {what}, fewer than {min_jobs}", len(w))
    return Figure(statistics.median(w), f"median of {len(w)} {what}", len(w))


def partition_requeue_waits(allocs) -> list[float]:
    """For every requeued job in the partition's sacct history, each later attempt's Start − the
    previous attempt's End (seconds): Slurm's side of a requeue, any job's (watch/progress.py's
    `run_requeue_waits` is one run's own, from its records)."""
    by_job: dict[str, list[Alloc]] = {}
    for a in allocs:
        by_job.setdefault(a.job, []).append(a)
    out = []
    for attempts in by_job.values():
        attempts.sort(key=lambda a: a.start or datetime.max)
        out += [
            (b.start - a.end).total_seconds()
            for a, b in zip(attempts, attempts[1:])
            if a.end and started(b) and b.start >= a.end
        ]
    return out


def requeue_wait(hist: History, nodes: int, min_jobs: int = MIN_JOBS) -> Figure:
    """The median requeue wait of the partition (any size); with fewer than `min_jobs` requeues,
    a requeued job is taken to wait as a new job of its size does."""
    w = partition_requeue_waits(hist.allocs or ())
    if len(w) >= min_jobs:
        return Figure(statistics.median(w), f"median of {len(w)} requeues, End to next Start ({hist.text()})", len(w))
    q = queue_wait(hist, nodes, min_jobs)
    if not q.known:
        return Figure(None, f"unknown: {len(w)} requeue(s) in the history, and the queue wait is {q.source}", len(w))
    return Figure(
        q.seconds, f"as a new job's queue wait ({len(w)} requeue(s) in the history, fewer than {min_jobs})", q.n
    )


def read_now(partition: str, cache_s: float = NOW_CACHE_S) -> Now:
    """sinfo's allocated/idle/other/total and squeue's pending jobs of the partition now (as read
    at most `cache_s` ago)."""
    a, i, o, t = node_counts(partition, cache_s) or (None, None, None, None)
    return Now(a, i, o, t, pending_starts(partition, cache_s))

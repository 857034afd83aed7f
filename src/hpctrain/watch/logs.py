"""`hpctrain logs`: which file is a rank's log, and printing it as it grows (`logs -f`) until the run's
job has ended, asking Slurm at a follower's pace (watch/follow.py). No torch: this runs on login nodes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from hpctrain.errors import LaunchError
from hpctrain.run.layout import LOGS, METRICS, SUBMITIT, slurm_job_run_dir
from hpctrain.watch.follow import Endings, JobEnd, Moved, Pace, run_files
from hpctrain.watch.jobinfo import job_state, local_state, where_of
from hpctrain.watch.lookup import resolve, slurm_workdir
from hpctrain.watch.progress import MetricsTail


def log_path(target: str, rank: int) -> Path:
    """Rank `rank`'s log: <run>/logs/rank-<r>.log, else the task's submitit output."""
    run_dir, job_id, _ = resolve(target)
    if run_dir is None:
        raise LaunchError(f"no run directory known for job {job_id}: give the run directory instead")
    p = run_dir / LOGS / f"rank-{rank}.log"
    if not p.exists() and job_id:
        cand = run_dir / SUBMITIT / f"{job_id}_{rank}_log.err"
        if cand.exists():
            return cand
    return p


def wait_for_run(target: str, pace: Pace | None = None, tick_s: float = 2.0) -> tuple[Path | None, str | None, str]:
    """(run dir, job id, executor) for `logs -f`: a job started with plain sbatch names its run
    only once rank 0 is up (its record in the working directory), so wait for that (saying so once)
    unless the job ends first; Slurm is asked at `pace` only (watch/follow.py)."""
    run_dir, job_id, executor = resolve(target)
    if run_dir is not None or not job_id or executor != "slurm":
        return run_dir, job_id, executor
    work = slurm_workdir(job_id)
    end, said = JobEnd(job_id, lambda: job_state(job_id), pace, at_once=True), False
    while not (work and (run_dir := slurm_job_run_dir(Path(work), job_id))):
        asks = end.asks
        if end():
            return None, job_id, executor
        if not work and end.asks > asks:  # no working directory known yet: ask with the queue
            work = slurm_workdir(job_id)
        if not said:
            print(
                f"hpctrain: waiting for job {job_id} to start and name its run directory …", file=sys.stderr, flush=True
            )
            said = True
        time.sleep(tick_s)
    return run_dir.resolve(), job_id, executor


def has_ended(
    run_dir: Path | None,
    job_id: str | None,
    executor: str,
    path: Path | None = None,
    pace: Pace | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[], bool]:
    """Whether the run's job is over: Slurm's final state for a Slurm job, asked at `pace` and only
    while the log at `path` and the run's files stand still (watch/follow.py); for a local run (or
    one without a job), when no process of it lives on this host any more (finished, failed,
    stopped or killed)."""
    if executor == "slurm" and job_id:
        where = where_of(run_dir)
        files = [*([path] if path else []), *(run_files(run_dir, job_id) if run_dir else [])]
        endings = Endings(MetricsTail(run_dir / METRICS)) if run_dir else (lambda: 0)
        return JobEnd(job_id, lambda: job_state(job_id, where), pace, Moved(files), endings, clock=clock, at_once=True)
    return lambda: run_dir is None or local_state(run_dir) is None


def follow(
    path: Path,
    ended: Callable[[], bool],
    poll_s: float = 0.5,
    out=sys.stdout,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Print the file as it grows (like tail -f) until `ended()` (checked every 2 s; a Slurm job's
    paces its own asks), then once more."""
    pos, last_check, done = 0, None, False
    while True:
        if path.exists():
            with open(path, errors="replace") as f:
                f.seek(pos)
                chunk = f.read()
                pos = f.tell()
            if chunk:
                out.write(chunk)
                out.flush()
        if done:
            return
        if last_check is None or clock() - last_check >= 2:
            last_check = clock()
            done = ended()  # one more read after the end
        sleep(poll_s)

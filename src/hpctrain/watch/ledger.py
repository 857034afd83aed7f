"""A run's goodput ledger on the login node: its records plus sacct's allocations of every job that
trained it (run/goodput.py adds them up). `hpctrain goodput`, `status` and `report` read it here.

sacct -D gives one row per run of a job (a requeue is another row, with its own Submit: the time it
was queued again) in the cluster's local time (`2026-12-07T05:40:01`, `Unknown` while it runs);
a --no-kill job that lost a node has a RESIZING row for its allocation before it shrank (measured,
22.05), whose Submit and Start are the allocation's: jobinfo.merge_resized gives them to the next row.
"""

from __future__ import annotations

from hpctrain.run import goodput
from hpctrain.run.goodput import Allocation, Ledger
from hpctrain.site.slurm_cli import when
from hpctrain.watch.jobinfo import ANY, Where, accounting


def sacct_time(text: str) -> float | None:
    """sacct's local time (slurm_cli.when) as a Unix time; None for Unknown, None or an empty field."""
    t = when(text)
    return t.timestamp() if t else None


def allocations_of(job: str, rows: list[dict[str, str]]) -> list[Allocation]:
    """The allocations of one job from its sacct rows (oldest first; jobinfo.accounting's, RESIZING rows
    merged into the next); a row that has not started (PENDING) is none yet."""
    out: list[Allocation] = []
    for row in rows:
        submit, start = sacct_time(row.get("Submit", "")), sacct_time(row.get("Start", ""))
        if submit is not None and start is not None:
            end = sacct_time(row.get("End", ""))
            out.append(Allocation(job, len(out), submit, start, end, row.get("State", "")))
    return out


def jobs_of(records: list[dict], job_id: str | None) -> list[str]:
    """The Slurm jobs that trained the run: its startup and restart records', and the current one."""
    jobs = [str(r["job"]) for r in records if r.get("kind") in ("startup", "restart") and r.get("job")]
    if job_id:
        jobs.append(str(job_id))
    return list(dict.fromkeys(j for j in jobs if j.isdigit()))


def run_ledger(records: list[dict], job_id: str | None = None, where: Where = ANY, now: float | None = None) -> Ledger:
    """The ledger of a run from its records (goodput.run_records); with Slurm jobs, sacct's allocations
    of each (none where sacct cannot answer: then the wall time starts at the first launch)."""
    allocs: list[Allocation] = []
    for job in jobs_of(records, job_id):
        allocs += allocations_of(job, accounting(job, where).rows)
    return goodput.build(records, allocs, now)

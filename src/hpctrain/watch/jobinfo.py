"""What a run's job is doing: Slurm's accounting rows (sacct), kept to this run's job and asked of
the cluster it was submitted to, or the controller's view (squeue, scontrol) when sacct cannot
answer; for a local run, whether a process of it lives on this host.

Facts (Slurm 22.05.8 on the test cluster; sources in docs/observability.md, "hpctrain status"):
- Without accounting storage (AccountingStorageType=accounting_storage/none) sacct prints "Slurm
  accounting storage is disabled" and exits 1; with slurmdbd down, "Problem talking to the
  database: Connection refused", exit 1. squeue and `scontrol show job` still answer: squeue lists
  a job while it is pending or running, scontrol also for MinJobAge (default 300 s) after its end.
- A job id names one job only while slurmctld's counter does not start again (state lost, or
  MaxJobId reached: ids wrap to FirstJobId): `sacct -D -j ID` then also lists the older jobs of
  that id. The rows of this run's job are those whose WorkDir is the job's working directory.
- sacct reads no SLURM_CLUSTERS (sacct(1), ENVIRONMENT VARIABLES), only -M/--clusters; sbatch
  and squeue take SLURM_CLUSTERS (and sbatch SBATCH_CLUSTERS) as --clusters.
No torch: this runs on login nodes.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.pids import alive
from hpctrain.run.layout import ENV, JOB, LOCK, read_json
from hpctrain.site.slurm_cli import ask, job_record, queue_state

# Submit, Start, End: the goodput ledger (watch/ledger.py)
FIELDS = ("JobID", "State", "ExitCode", "WorkDir", "NodeList", "Elapsed", "Submit", "Start", "End")
# the variables that send a submission to another cluster (sbatch(1): same as --clusters)
CLUSTER_VARS = ("SBATCH_CLUSTERS", "SLURM_CLUSTERS")


@dataclass(frozen=True)
class Where:
    """Which job of that id is the run's: the cluster(s) it was submitted to (sacct -M; None: the
    local one) and its working directory (sacct's WorkDir; None: unknown, no row is left out)."""

    clusters: str | None = None
    workdir: str | None = None


ANY = Where()  # any job of the id, on the local cluster


@dataclass(frozen=True)
class Accounting:
    """sacct's rows of the job, oldest first; `error`: why sacct could not answer ("" when it did)."""

    rows: list[dict[str, str]] = field(default_factory=list)
    error: str = ""


def submitted_clusters(environ: Mapping[str, str] | None = None) -> str | None:
    """The cluster list a submission from this environment goes to (None: the local cluster)."""
    env = os.environ if environ is None else environ
    return next((env[k] for k in CLUSTER_VARS if env.get(k)), None)


def where_of(run_dir: Path | None) -> Where:
    """Where the run's job ran, from its records: job.json's `slurm_clusters` (hpctrain submit) or
    the job's own SLURM_CLUSTER_NAME (env.json); its working directory: the batch shell's control
    directory's parent (env.json's HPCTRAIN_CONTROL_DIR), else the run directory (submit's --chdir)."""
    if run_dir is None:
        return Where()
    job, env = read_json(run_dir / JOB, {}), read_json(run_dir / ENV, {}).get("env", {})
    job_id = str(job.get("job_id") or "")
    if job_id and str(env.get("SLURM_JOB_ID") or "") != job_id:
        env = {}  # another job's attempt (the run resubmitted since): its facts are not this job's
    clusters = job.get("slurm_clusters") or env.get("SLURM_CLUSTER_NAME") or None
    control = env.get("HPCTRAIN_CONTROL_DIR")
    if control:
        workdir = str(Path(control).parent)
    elif job.get("submitit"):
        workdir = str(Path(job["submitit"]).parent)
    else:
        workdir = None
    return Where(clusters, workdir)


def sacct_args(job_id: str, where: Where = ANY, fields: tuple[str, ...] = FIELDS) -> list[str]:
    """The sacct command for every run of the job (requeues included: -D), on its cluster."""
    cluster = ["-M", where.clusters] if where.clusters else []
    return ["sacct", "-n", "-X", "-P", "-D", *cluster, "-j", str(job_id), "-o", ",".join(fields)]


def own_rows(rows: list[dict[str, str]], workdir: str | None) -> list[dict[str, str]]:
    """The rows of the job that ran in `workdir` (an earlier job of the same id ran elsewhere); a
    row without WorkDir yet (slurmdbd fills it in a moment after the start, measured) is kept."""
    if not workdir:
        return rows
    want = os.path.realpath(workdir)
    return [r for r in rows if not r.get("WorkDir") or os.path.realpath(r["WorkDir"]) == want]


def accounting(job_id: str, where: Where = ANY) -> Accounting:
    """One row per run of the allocation (requeues included), oldest first, of this run's job only."""
    text, error = ask(*sacct_args(job_id, where))
    if text is None:
        return Accounting([], error)
    rows = [dict(zip(FIELDS, line.split("|"))) for line in text.splitlines() if line.strip()]
    for row in rows:
        row["State"] = (row.get("State") or "UNKNOWN").split()[0]  # "CANCELLED by 0" → CANCELLED
    return Accounting(own_rows(merge_resized(rows), where.workdir))


def merge_resized(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The rows without RESIZING ones. A --no-kill job that lost a node (hot spares) has a RESIZING row
    for its allocation before it shrank (measured, 22.05): the same run, not a requeue; the row after
    it was Submitted and Started at the shrink, so it takes the RESIZING row's Submit and Start (the
    allocation's: the goodput ledger's queue wait and allocated time)."""
    out: list[dict[str, str]] = []
    carried: dict[str, str] | None = None
    for row in rows:
        if row["State"] == "RESIZING":
            carried = carried or {k: row[k] for k in ("Submit", "Start") if k in row}
            continue
        out.append({**row, **(carried or {})})
        carried = None
    return out


def sacct_rows(job_id: str, where: Where = ANY) -> list[dict[str, str]]:
    """One row per run of the allocation (requeues included), oldest first; [] when unknown."""
    return accounting(job_id, where).rows


def job_state(job_id: str, where: Where = ANY) -> str:
    """The job's state now: its last sacct row, else the controller's (squeue, then scontrol); UNKNOWN
    when none of them knows the job."""
    rows = sacct_rows(job_id, where)
    # A preempted --requeue job is requeued by Slurm itself (PreemptMode=REQUEUE; since 24.05 also when
    # it ends inside its GraceTime): its PREEMPTED row is the last one for a few seconds before the
    # next run's row appears (measured, docs/slurm-versions.md), while squeue still holds it.
    if rows and not (rows[-1]["State"] == "PREEMPTED" and queue_state(str(job_id))):
        return rows[-1]["State"]
    # no row (sacct cannot answer, or not yet): the controller's, which keeps an ended job MinJobAge
    return queue_state(str(job_id)) or job_record(job_id).get("JobState") or "UNKNOWN"


def settled_state(state: str, metrics: dict) -> str:
    """Slurm's final state, unless the run's own end record contradicts it: Slurm >= 24.05 records
    PREEMPTED for a job it once signalled for preemption, even after a requeue of ours ran it to the
    end (its mark stays: launch/shell/stops.sh, docs/slurm-versions.md)."""
    if state == "PREEMPTED" and metrics.get("end") == "finished":
        return "COMPLETED"
    return state


def controller_view(job_id: str, where: Where, metrics: dict) -> tuple[str, int, str]:
    """(state, requeues, nodes) from `scontrol show job` (Restarts: its requeues so far), else squeue;
    ("", …) once the controller has forgotten the job (MinJobAge after its end). A record of
    another working directory is another job of that id (after an id reset)."""
    rec = job_record(job_id)
    if where.workdir and rec.get("WorkDir") and own_rows([rec], where.workdir) == []:
        rec = {}
    restarts, nodes = rec.get("Restarts", ""), rec.get("NodeList", "")
    return (
        rec.get("JobState") or ("" if where.workdir else (queue_state(str(job_id)) or "")),
        int(restarts) if restarts.isdigit() else metrics.get("stops", 0),
        "" if nodes == "(null)" else nodes,
    )


def local_state(run_dir: Path) -> str | None:
    """RUNNING while a process of the run lives on this host: the one that holds the run's lock
    (run.rundir), or the controller of its local job (its id is the controller's pid), which
    lives until every task has ended."""
    host = socket.gethostname()
    holder, job = read_json(run_dir / LOCK, {}), read_json(run_dir / JOB, {})
    pids = [holder.get("pid")] if holder.get("host") == host else []
    if job.get("executor") == "local" and job.get("host") == host and str(job.get("job_id", "")).isdigit():
        pids.append(int(job["job_id"]))
    return "RUNNING" if any(isinstance(p, int) and alive(p) for p in pids) else None

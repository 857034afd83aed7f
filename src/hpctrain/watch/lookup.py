"""Which run `hpctrain status` / `logs` are asked about: a run directory, a run's name under runs/, the
id of a local job (`hpctrain submit` without Slurm: under ./runs, alive on this host, or noted in the
user's cache) or a Slurm job id (its working directory from sacct, squeue or scontrol). No torch: this
runs on login nodes.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

from hpctrain.errors import LaunchError
from hpctrain.run.layout import CONFIG, ENV, JOB, LOCK, METRICS, RUNS, read_json, slurm_job_run_dir
from hpctrain.site import user_cache
from hpctrain.site.slurm_cli import NO_CONFIG_RE, job_record, queue_workdir
from hpctrain.watch.jobinfo import accounting


def local_job_run(job_id: str, runs: Path = RUNS) -> Path | None:
    """The run under `runs` (or a sweep's member there) whose local job (`hpctrain submit` or
    `sweep` without Slurm) has this id (its job.json: the id submit printed, on this host)."""
    host = socket.gethostname()
    for rec_path in sorted([*runs.glob("*/job.json"), *runs.glob("*/*/job.json")]):  # runs, sweeps' members
        rec = read_json(rec_path, {})
        if rec.get("executor") == "local" and str(rec.get("job_id")) == job_id and rec.get("host", host) == host:
            return rec_path.parent
    return None


# submitit's local controller: `python -m submitit.local._local <run>/submitit` (submitit/local/local.py,
# start_controller); a local job's id is its pid (launch/submit.py submit_local records it in job.json)
LOCAL_CONTROLLER = "submitit.local._local"


def live_local_job(job_id: str) -> Path | None:
    """The run of a local job still alive on this host, from any directory: the process of that pid is
    submitit's local controller, the folder it was given is <run>/submitit, and that run's job.json
    names this id (a reused pid names another job's run). None on a machine without /proc."""
    proc = Path("/proc") / job_id
    try:
        argv = [a.decode(errors="replace") for a in (proc / "cmdline").read_bytes().split(b"\0")]
    except OSError:
        return None
    if LOCAL_CONTROLLER not in argv[:-1] or argv[argv.index(LOCAL_CONTROLLER) - 1] != "-m":
        return None
    folder = Path(argv[argv.index(LOCAL_CONTROLLER) + 1])
    if not folder.is_absolute():  # submit gives it absolute (absolute_paths); another caller may not
        try:
            folder = Path(os.readlink(proc / "cwd")) / folder
        except OSError:
            return None
    rec = read_json(folder.parent / JOB, {})
    return folder.parent if rec.get("executor") == "local" and str(rec.get("job_id")) == job_id else None


LOCAL_JOB_DAYS = 90  # how long `status ID` finds a local job's run from any directory after its start


def local_job_entry(job_id: str) -> str:
    return user_cache.entry_name("local-job", socket.gethostname(), job_id)


def remember_local_job(job_id: str, run_dir: Path) -> None:
    """Note in the user's cache (site/user_cache.py) which run local job `job_id` of this host trains:
    `status ID` finds it from any directory, also after it has ended (a pid names one job at a time;
    the newest job of that id wins, as with Slurm's ids)."""
    user_cache.write(local_job_entry(job_id), {"run_dir": str(run_dir.resolve())})


def remembered_local_job(job_id: str) -> Path | None:
    """The run `remember_local_job` noted for this id, while its job.json still names the job."""
    hit = user_cache.read(local_job_entry(job_id), LOCAL_JOB_DAYS * 86400)
    run = Path(str(hit[0].get("run_dir") or "")) if hit else None
    if run is None or not run.is_absolute():
        return None
    rec = read_json(run / JOB, {})
    return run if rec.get("executor") == "local" and str(rec.get("job_id")) == job_id else None


# what makes a directory a run's: any one of these (config.yaml: the task's resolved config;
# job.json: `hpctrain submit`'s record; env.json, metrics.jsonl, .lock: a task that started)
RUN_FILES = (CONFIG, JOB, ENV, METRICS, LOCK)
SWEEP = "sweep.json"  # a sweep's record (launch/sweep.py SWEEP_FILE: launch/ stands above watch/)


def is_run_dir(p: Path) -> bool:
    return any((p / f).is_file() for f in RUN_FILES)


def not_a_run(target: str, p: Path, shown: int = 6) -> LaunchError:
    """The one line for a directory that is no run (`status runs`, `logs /tmp`): the runs under it
    (a sweep: a folder of runs), else what to give."""
    try:
        subdirs = sorted(c for c in p.iterdir() if c.is_dir() and c.name.isprintable())
    except OSError:
        subdirs = []
    runs = [c for c in subdirs if is_run_dir(c) or (c / SWEEP).is_file()]
    why = f"{target} is not a run directory (no {CONFIG}, {JOB} or {METRICS} in it)"
    if not runs:
        return LaunchError(f"{why}: give a run directory (runs/<name>), a run's name, or the job id submit printed")
    names = ", ".join(str(Path(target) / c.name) for c in runs[:shown])
    more = f" (+{len(runs) - shown} more)" if len(runs) > shown else ""
    return LaunchError(f"{why}: give one of the runs under it: {names}{more}")


def resolve(target: str) -> tuple[Path | None, str | None, str]:
    """(run dir, job id, executor) for a run directory, a run name under runs/, the id of a local
    job that `hpctrain submit` printed (under ./runs, alive on this host, or noted in the user's
    cache by submit), or a Slurm job id.
    A directory that is no run is refused (LaunchError), as is an id neither knows."""
    p = Path(target)
    named = RUNS / target
    if not p.is_dir() and not p.is_absolute() and any((named / f).is_file() for f in (JOB, METRICS)):
        p = named  # a run's name under the default run.dir (a sweep's member: <sweep>/<member>)
    if not p.is_dir() and target.isdigit():
        p = local_job_run(target) or live_local_job(target) or remembered_local_job(target) or p
    if p.is_dir():
        if not is_run_dir(p):
            raise not_a_run(target, p)
        job = read_json(p / JOB, {})
        env = read_json(p / ENV, {}).get("env", {})
        job_id = job.get("job_id") or env.get("SLURM_JOB_ID")
        return p.resolve(), job_id, job.get("executor") or ("slurm" if job_id else "none")
    if target.isdigit():
        work = slurm_workdir(target)
        return (slurm_job_run_dir(Path(work), target) if work else None), target, "slurm"
    raise LaunchError(
        f"{target!r} is neither a run directory, a run name under {RUNS}/ nor a job id: give "
        "runs/<name>, <name>, or the job id that `hpctrain submit` printed"
    )


NO_LOCAL_JOB = f"no local job of this host has that id (under {RUNS}/ here, alive, or submitted by you)"


def no_slurm(job_id: str, why: str) -> LaunchError:
    return LaunchError(
        f"job {job_id}: {NO_LOCAL_JOB}, and Slurm cannot be asked ({why}): give the run directory "
        "(runs/<name>), or run this where the job was submitted"
    )


def slurm_workdir(job_id: str) -> str:
    """The working directory of Slurm job `job_id`: sacct's newest row, else squeue, else scontrol
    ("" when the job is known but none names it). One question each, no waiting: sbatch returns
    the id once slurmctld holds the job, so squeue and scontrol know it from then on (slurm_cli.ask
    asks again after a transient failure). A job none of them knows is a LaunchError, and so is a
    machine whose Slurm cannot answer: no client, no configuration, no daemon."""
    conf = os.environ.get("SLURM_CONF")
    if not shutil.which("sacct") and not shutil.which("squeue"):
        raise no_slurm(job_id, "no Slurm client on this machine")
    if conf and not os.path.exists(conf):  # the clients would retry reading it for 60 s (slurm_cli.slurm_here)
        raise no_slurm(job_id, f"$SLURM_CONF={conf} does not exist")
    acct = accounting(job_id)
    if NO_CONFIG_RE.search(acct.error):  # a client with no configuration: the others have none either
        raise no_slurm(job_id, acct.error)
    if acct.rows:  # the last row: the newest job of that id
        return acct.rows[-1].get("WorkDir") or ""
    queued = queue_workdir(str(job_id))  # None: squeue did not answer
    work = queued or job_record(job_id).get("WorkDir")
    if work:
        return work
    if acct.error and queued is None:
        raise no_slurm(job_id, f"{acct.error}; squeue does not answer either")
    raise LaunchError(
        f"job {job_id} is unknown to Slurm (sacct, squeue, scontrol), and {NO_LOCAL_JOB}: check the id, or "
        "give the run directory instead (runs/<name>)"
    )

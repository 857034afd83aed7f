"""`hpctrain status` / `hpctrain logs`: a run directory or a job id → state, progress, logs.

The job's state comes from Slurm accounting (`sacct`, one row per requeue with --duplicates, the
rows of this run's job on its cluster: watch/jobinfo.py), or from squeue and scontrol when sacct
cannot answer (no accounting storage, slurmdbd down); progress from the run's metrics.jsonl. No
torch: this runs on login nodes.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from hpctrain.config_moves import current
from hpctrain.errors import LaunchError
from hpctrain.pids import alive
from hpctrain.run import faultlog
from hpctrain.run.layout import (
    CONFIG,
    CONTROL,
    ENV,
    JOB,
    LOCK,
    LOGS,
    METRICS,
    RUNS,
    SUBMITIT,
    read_json,
    slurm_job_run_dir,
)
from hpctrain.run.metrics import NONFINITE_FIELDS, read_metrics, table, total_steps
from hpctrain.site import user_cache
from hpctrain.site.slurm_cli import NO_CONFIG_RE, job_record, queue_state, queue_workdir
from hpctrain.watch.follow import TERMINAL, WAITING, Endings, JobEnd, Moved, Pace
from hpctrain.watch.jobinfo import ANY, Accounting, Where, accounting, own_rows, where_of
from hpctrain.watch.progress import Eta, MetricsTail, duration, eta, iso, recent_straggler, steps_per_s
from hpctrain.watch.steps import Step, oom_steps, sacct_steps, size_text


def sacct_rows(job_id: str, where: Where = ANY) -> list[dict[str, str]]:
    """One row per run of the allocation (requeues included), oldest first; [] when unknown."""
    return accounting(job_id, where).rows


def job_state(job_id: str, where: Where = ANY) -> str:
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


def wait_job(
    job_id: str,
    pace: Pace | None = None,
    files: Sequence[Path] = (),
    done_file: Path | None = None,
    tick_s: float = 2.0,
) -> str:
    """Wait until the job has ended for good (a requeued job keeps it going): its end state. Slurm is
    asked at `pace` (watch/follow.py), not while `files` grow; `done_file` appearing (an evaluation's
    summary) asks sooner."""
    done = (lambda: int(done_file.exists())) if done_file else (lambda: 0)
    end = JobEnd(job_id, lambda: job_state(job_id), pace, Moved(files), done)
    while not end():
        time.sleep(tick_s)
    return end.state


def run_files(run_dir: Path, job_id: str) -> list[Path]:
    """The files a Slurm job of the run writes to while it lives (watched at no Slurm cost): its
    metrics, rank 0's log, the batch shell's and rank 0's task output."""
    return [
        run_dir / METRICS,
        run_dir / LOGS / "rank-0.log",
        run_dir / SUBMITIT / f"{job_id}_0_log.out",
        run_dir / SUBMITIT / f"{job_id}_0_log.err",
    ]


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
SWEEP = "sweep.json"  # a sweep's record (launch/sweep.py SWEEP_FILE; that module imports this one)


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


@dataclass
class RunStatus:
    run_dir: Path | None
    job_id: str | None
    executor: str
    state: str
    requeues: int = 0
    nodes: str = ""
    metrics: dict = field(default_factory=dict)
    total_steps: int | None = None
    steps_per_s: float | None = None
    eta: Eta = field(default_factory=lambda: Eta(None, None, "no metrics yet"))
    now: float = field(default_factory=time.time)
    oom: list[Step] = field(default_factory=list)  # the job's steps that died OUT_OF_MEMORY (watch/steps.py)
    accounting: str = ""  # why sacct could not answer: the state is the controller's, no requeue history

    def age(self, t: float | None) -> float | None:
        return None if t is None else max(0.0, self.now - t)

    def facts(self) -> dict:
        """Everything `text` shows, by machine names (`hpctrain status --json`)."""
        m = self.metrics
        not_requeued = m.get("not_requeued")
        return {
            "state": self.state,
            "job_id": self.job_id,
            "executor": self.executor,
            "run_dir": str(self.run_dir) if self.run_dir else None,
            "nodes": self.nodes or None,
            "requeues": self.requeues,
            "preemptions": m.get("preemptions", 0),
            "time_limits": m.get("time_limits", 0),
            "stopped_at": m.get("stopped_at"),
            "stop_reason": m.get("stop_reason") if m.get("stopped_at") is not None else None,
            "not_requeued": {"step": not_requeued[0], "why": not_requeued[1]} if not_requeued else None,
            "step": m.get("step"),
            "total_steps": self.total_steps,
            "epoch": m.get("epoch"),
            "loss": m.get("loss"),
            "images_per_s": m.get("images_per_s"),
            "mfu": m.get("mfu"),
            "steps_per_s": self.steps_per_s,
            "last_record_age_s": self.age(m.get("last_time")),
            "eta_s": self.eta.seconds,
            "eta_at": iso(self.eta.at),
            "eta_note": self.eta.note or None,
            "straggler": m.get("straggler"),
            "hang": m.get("hang"),
            "last_eval": m.get("last_eval"),
            "nonfinite": m.get("nonfinite", 0),
            "rollbacks": m.get("rollbacks", 0),
            "last_nonfinite": m.get("last_nonfinite"),
            "last_rollback": m.get("last_rollback"),
            "checkpoint": m.get("checkpoint"),
            "checkpoint_step": m.get("checkpoint_step"),
            "checkpoint_age_s": self.age(m.get("checkpoint_time")),
            "restarts_in_job": m.get("restarts", 0),
            "last_restart": m.get("last_restart"),
            "excluded_nodes": m.get("excluded", {}),
            "out_of_memory": [s.facts() for s in self.oom],
            "last_memory": m.get("memory"),
            "accounting": self.accounting or None,
        }

    def text(self) -> str:
        m, f = self.metrics, self.facts()
        state = self.state
        if m.get("stopped_at") is not None and not m.get("not_requeued"):  # last word: a stop, not an end
            state += f" (stopped at step {m['stopped_at']}: {m.get('stop_reason')}, not resumed yet)"
        if m.get("not_requeued"):
            state += f" (stopped at step {m['not_requeued'][0]} and not requeued: {m['not_requeued'][1]})"
        if self.oom and state != self.oom[-1].state:
            state += f" (step {self.oom[-1].step_id} {self.oom[-1].state})"
        requeues = str(self.requeues)
        kinds = m.get("stop_kinds") or {}
        local = self.executor in ("local", "none")  # no scheduler: each resume follows a stop of the run's own
        if self.requeues and local:
            requeues += " (" + ", ".join(f"{n} {STOP_WORDS.get(k, k)}" for k, n in sorted(kinds.items())) + ")"
        elif self.requeues:
            pre, tl = m.get("preemptions", 0), m.get("time_limits", 0)
            mine = kinds.get("interrupt", 0) + kinds.get("halt", 0)
            requeues += (
                f" ({pre} after preemption, {tl} after a time limit, "
                + (f"{mine} after Ctrl-C or HPCTRAIN_HALT_AT, " if mine else "")
                + f"{max(0, self.requeues - pre - tl - mine)} other: node failure or outside requeue)"
            )
        rows = [
            ("state", state),
            ("job", f"{self.job_id or '-'} ({self.executor})"),
            ("run directory", str(self.run_dir or "-")),
            ("stops" if local else "requeues", requeues),
        ]
        if self.accounting:
            rows.append(("accounting", self.accounting))
        if self.nodes:
            rows.append(("nodes", self.nodes))
        if m.get("restarts"):
            r = m["last_restart"]
            last = f"attempt {r.get('attempt')} of job {r.get('job')}"
            if r.get("nodes"):  # the batch shell left faulty nodes out: a spare took their place
                where, last = "on spare nodes", f"{last} without {','.join(r['nodes'])}"
            else:  # a crashed rank on a healthy node (launch/shell/restarts.sh)
                where = "on the same nodes"
            rows.append(("restarts", f"{m['restarts']} in the job {where} (last: {last}: {r.get('why')})"))
        if self.oom:
            rows.append(("out of memory", oom_text(self.oom, m.get("memory"))))
        if m.get("excluded"):
            rows.append(("excluded", "; ".join(f"{n} ({why})" for n, why in m["excluded"].items())))
        if m.get("step") is not None:
            total = f"/{self.total_steps} ({100 * m['step'] / self.total_steps:.0f} %)" if self.total_steps else ""
            ago = f", logged {duration(f['last_record_age_s'])} ago" if f["last_record_age_s"] is not None else ""
            rows.append(("last step", f"{m['step']}{total}, epoch {m.get('epoch') or 0:.2f}{ago}"))
        if m.get("loss") is not None:
            rows.append(("train loss", f"{m['loss']:.4f}"))
        elif m.get("loss_nonfinite"):
            rows.append(("train loss", f"{m['loss_nonfinite']} (not finite)"))
        speed = [f"{m['images_per_s']:.0f} images/s"] if m.get("images_per_s") is not None else []
        if self.steps_per_s:
            speed.append(f"{self.steps_per_s:.3g} steps/s")
        if m.get("mfu") is not None:
            speed.append(f"MFU {100 * m['mfu']:.1f} %")
        if speed:
            rows.append(("speed", ", ".join(speed)))
        rows.append(("ETA", eta_text(self.eta)))
        if m.get("straggler"):
            rows.append(("straggler", straggler_text(m["straggler"])))
        if m.get("hang"):
            rows.append(("hang", hang_text(m["hang"])))
        if m.get("nonfinite"):
            rows.append(("divergence", divergence_text(m)))
        ev = m.get("last_eval")
        if ev:
            text = f"top-1 {ev['top1']:.2f} %, top-5 {ev.get('top5', float('nan')):.2f} % at step {ev.get('step')}"
            if ev.get("ema_top1") is not None:
                text += f" (EMA top-1 {ev['ema_top1']:.2f} %)"
            rows.append(("last eval", text))
        if m.get("checkpoint"):
            age = f", {duration(f['checkpoint_age_s'])} ago" if f["checkpoint_age_s"] is not None else ""
            rows.append(("checkpoint", f"{m['checkpoint']} (step {m.get('checkpoint_step')}{age})"))
        return table(rows, "hpctrain status")


def eta_text(e: Eta) -> str:
    if e.note == "finished":
        return f"finished at {iso(e.at)}" if e.at else "finished"
    if e.seconds is None:
        return e.note
    return f"{duration(e.seconds)} (at {iso(e.at)})" + (f", {e.note}" if e.note else "")


def oom_text(steps: list[Step], memory: dict | None) -> str:
    """The steps killed for memory, each with its peak (sacct), and the run's last memory record."""
    text = "; ".join(s.text() for s in steps)
    if memory:
        parts = [f"host RSS {size_text(memory['host_rss_gb'] * (1 << 30))}"] if memory.get("host_rss_gb") else []
        if memory.get("mem_reserved_gb") is not None:
            parts.append(f"GPU peak {size_text(memory['mem_reserved_gb'] * (1 << 30))} reserved")
        if parts:
            text += f"; last recorded by rank 0 at step {memory.get('step')}: {', '.join(parts)}"
    return text


def straggler_text(s: dict) -> str:
    where = ", ".join(
        x
        for x in (f"host {s['host']}" if s.get("host") else "", f"GPU {s['gpu']}" if s.get("gpu") is not None else "")
        if x
    )
    cause = s.get("cause") or "?"
    if cause == "data" and s.get("data_wait_s") is not None:
        cause += f" (waits {s['data_wait_s']:.3g} s per step for data)"
    pct = s.get("slower_pct")
    return (
        f"rank {s.get('rank')}"
        + (f" ({where})" if where else "")
        + (f" {pct:.0f} % slower than the median" if pct is not None else "")
        + f" at step {s.get('step')}: {cause}"
    )


def divergence_text(m: dict) -> str:
    """Non-finite losses and spikes, and what the run did about the last one (train/health/guard.py)."""
    ev, rb = m["last_nonfinite"], m.get("last_rollback")
    text = f"{m['nonfinite']} event(s), {m.get('rollbacks', 0)} rollback(s); last: {ev['reason']} at step {ev['step']}"
    if rb and rb.get("from_step") == ev["step"]:
        text += f", rolled back to step {rb['step']} ({rb['checkpoint']}), {rb['skip_batches']} batches skipped"
    return text


def hang_text(h: dict) -> str:
    ranks = h.get("ranks") or []
    where = h.get("where") or [None] * len(ranks)
    named = ", ".join(f"rank {r}" + (f" at {w}" if w else "") for r, w in zip(ranks, where))
    files = h.get("files") or []
    more = f" (+{len(files) - 3})" if len(files) > 3 else ""
    return f"at step {h.get('step')}: {named or 'no rank named'} not at the latest step" + (
        f"; dumps: {', '.join(files[:3])}{more}" if files else ""
    )


def node_reasons(why: str) -> dict[str, str]:
    """'n2: why; n3: why' (the batch shell's fault line) → {node: why}."""
    out: dict[str, str] = {}
    for part in why.split("; "):
        node, sep, reason = part.partition(": ")
        if sep and node not in out:
            out[node] = reason
    return out


def add_excluded(metrics: dict, path: Path) -> None:
    """The nodes the batch shell left out (faultlog.read_excluded), with their evidence, into
    metrics["excluded"]: written as the shell decides, so a job waiting in the queue after its requeue
    names them before its next attempt's rank 0 records them (a node already there keeps its record's)."""
    for node, (_, why) in faultlog.read_excluded(path).items():
        metrics.setdefault("excluded", {}).setdefault(node, node_reasons(why).get(node) or why)


def summarize(records: list[dict]) -> dict:
    """The run's last word on each thing `hpctrain status` shows, from its metrics records."""
    out: dict = {}
    for rec in records:
        kind = rec.get("kind")
        if isinstance(rec.get("time"), (int, float)):
            out["last_time"] = rec["time"]
        if kind == "train":
            out.update(
                step=rec.get("step"),
                epoch=rec.get("epoch", 0),
                loss=rec.get("loss"),
                images_per_s=rec.get("images_per_s"),
                mfu=rec.get("mfu"),
                # a non-finite value is written as null, its kind under nonfinite_fields (metrics.py)
                loss_nonfinite=(rec.get(NONFINITE_FIELDS) or {}).get("loss"),
            )
            memory = {k: rec[k] for k in ("host_rss_gb", "mem_reserved_gb", "mem_alloc_gb") if rec.get(k) is not None}
            if memory:  # rank 0's (train/observe/speed.py): host RSS now, the GPU allocator's peak in the window
                out["memory"] = {"step": rec.get("step"), **memory}
        elif kind == "eval" and rec.get("top1") is not None:  # (a run without a val set records none)
            out.update(top1=rec.get("top1"), eval_step=rec.get("step"))
            out["last_eval"] = {
                k: rec[k] for k in ("step", "top1", "top5", "loss", "ema_top1", "ema_top5") if rec.get(k) is not None
            }
        elif kind == "checkpoint":
            out.update(checkpoint=rec.get("path"), checkpoint_step=rec.get("step"), checkpoint_time=rec.get("time"))
        elif kind == "stop":
            out["stops"] = out.get("stops", 0) + 1
            out["stopped_at"], out["stop_reason"] = rec.get("step"), rec.get("stop_kind") or rec.get("reason")
            kinds = out.setdefault("stop_kinds", {})  # how many stops of each kind (a Ctrl-C is no node's fault)
            kinds[out["stop_reason"]] = kinds.get(out["stop_reason"], 0) + 1
            if rec.get("detail"):  # a divergence's stop: why it did not roll back
                out["stop_reason"] += f" ({rec['detail']})"
        elif kind == "nonfinite":
            out["nonfinite"] = out.get("nonfinite", 0) + 1
            out["last_nonfinite"] = {k: rec.get(k) for k in ("step", "reason", "loss", "median")}
        elif kind == "rollback":
            out["rollbacks"] = out.get("rollbacks", 0) + 1
            out["last_rollback"] = {k: rec.get(k) for k in ("step", "from_step", "checkpoint", "skip_batches")}
        elif kind == "requeue":
            if rec.get("requeue"):
                key = {"preemption": "preemptions", "exclude": None}.get(rec.get("reason"), "time_limits")
                if key:  # a node excluded: an "other" requeue (or none: a restart on a spare)
                    out[key] = out.get(key, 0) + 1
                out["not_requeued"] = None
            else:
                out["not_requeued"] = (rec.get("step"), rec.get("why"))
        elif kind == "end":
            out["end"] = rec.get("status")
            out["stopped_at"] = None
        elif kind == "hang":
            out["hang"] = rec
        elif kind in ("restart", "exclude"):  # the batch shell's, on spare nodes or before a requeue (faultlog.py)
            if kind == "restart":
                out["restarts"] = out.get("restarts", 0) + 1
                out["last_restart"] = {k: rec.get(k) for k in ("job", "attempt", "nodes", "why", "decided_at")}
            why = node_reasons(str(rec.get("why") or ""))
            for n in rec.get("nodes") or []:
                out.setdefault("excluded", {})[n] = why.get(n) or rec.get("why")
        if kind == "train":
            out["hang"] = out["end"] = None  # steps after a diagnosed hang, or an end (resumed for more steps)
        if kind in ("train", "eval") and out.get("stopped_at") is not None and rec.get("step", 0) > out["stopped_at"]:
            out["stopped_at"] = None  # resumed past the stop
    out["straggler"] = recent_straggler(records)
    return out


def metrics_summary(run_dir: Path) -> dict:
    return summarize(read_metrics(run_dir / METRICS))


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


def stopped_state(metrics: dict) -> str | None:
    """INTERRUPTED when the run's last word is a Ctrl-C's stop (train.stop: never requeued)."""
    if metrics.get("stopped_at") is not None and metrics.get("stop_reason") == "interrupt":
        return "INTERRUPTED"
    return None


def progress_of(
    run_dir: Path | None, records: list[dict], state: str, metrics: dict, now: float
) -> tuple[int | None, float | None, Eta]:
    """(total steps, steps/s, ETA) of a run in `state`."""
    config = read_config(run_dir) if run_dir else {}
    total = total_steps(config, records)
    rate = steps_per_s(records, (config.get("data") or {}).get("global_batch"))
    if state in TERMINAL and metrics.get("end") != "finished":
        return total, rate, Eta(None, None, f"none: the job ended ({state})")
    if state == "INTERRUPTED":
        return (
            total,
            rate,
            Eta(None, None, f"none: interrupted at step {metrics.get('stopped_at')}; the same command resumes it"),
        )
    if state == "NOT RUNNING":
        return total, rate, Eta(None, None, "none: no process of this run is alive (see its logs)")
    waiting = state in WAITING or (metrics.get("stopped_at") is not None and not metrics.get("not_requeued"))
    return total, rate, eta(records, total, now, waiting, rate)


STOP_WORDS = {  # a stop record's kind, as `status` says it
    "interrupt": "after Ctrl-C",
    "halt": "at HPCTRAIN_HALT_AT (a test's halt)",
    "time_limit": "after a time limit (USR2)",
    "preemption": "after preemption (TERM)",
    "nonfinite": "after a divergence",
}


def read_config(run_dir: Path) -> dict:
    """The run's resolved config.yaml as plain data ({} when absent or unreadable)."""
    try:
        data = yaml.safe_load((run_dir / CONFIG).read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return current(data) if isinstance(data, dict) else {}


def run_status(target: str, now: float | None = None) -> RunStatus:
    now = time.time() if now is None else now
    run_dir, job_id, executor = resolve(target)
    records = read_metrics(run_dir / METRICS) if run_dir else []
    metrics = summarize(records)
    if run_dir and job_id:
        add_excluded(metrics, faultlog.excluded_path(run_dir / CONTROL, job_id))
    where = where_of(run_dir)
    acct = accounting(job_id, where) if job_id and executor == "slurm" else Accounting()
    rows = acct.rows
    oom = oom_steps(sacct_steps(job_id, where.clusters)) if rows and job_id else []
    note = ""
    if rows:
        state, requeues, nodes = settled_state(rows[-1]["State"], metrics), len(rows) - 1, rows[-1].get("NodeList", "")
    elif job_id and executor == "slurm":  # no accounting, slurmdbd down, or no row yet: the controller's view
        state, requeues, nodes = controller_view(job_id, where, metrics)
        if acct.error:
            came = "scontrol/squeue" if state else "the run's records (the controller no longer holds the job)"
            note = f"sacct cannot answer ({acct.error}): state from {came}; requeue history not shown"
    else:
        state, requeues, nodes = "", 0, ""
    if not state:  # local runs, or a job neither accounting nor the controller knows: what the run wrote
        running = run_dir and local_state(run_dir)
        state = (
            (metrics.get("end") == "finished" and "COMPLETED")
            or running
            or stopped_state(metrics)
            or (
                "NOT RUNNING"  # crashed, killed, or stopped with no job to requeue it
                if not job_id or (executor == "local" and metrics.get("stopped_at") is None)
                else "UNKNOWN"
            )
        )
        requeues, nodes = metrics.get("stops", 0), ""
    total, rate, e = progress_of(run_dir, records, state, metrics, now)
    return RunStatus(run_dir, job_id, executor, state, requeues, nodes, metrics, total, rate, e, now, oom, note)


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

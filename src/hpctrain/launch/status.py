"""`hpctrain status` / `hpctrain logs`: a run directory or a job id → state, progress, logs.

The job's state comes from Slurm accounting (`sacct`, one row per requeue with --duplicates);
progress from the run's metrics.jsonl. No torch: this runs on login nodes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.launch.submit import LaunchError
from hpctrain.train.metrics import read_metrics, table

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
            "DEADLINE", "PREEMPTED"}


def sacct_rows(job_id: str) -> list[dict[str, str]]:
    """One row per run of the allocation (requeues included), oldest first; [] when unknown."""
    if not shutil.which("sacct"):
        return []
    fields = ["JobID", "State", "ExitCode", "WorkDir", "NodeList", "Elapsed"]
    try:
        r = subprocess.run(["sacct", "-n", "-X", "-P", "-D", "-j", str(job_id), "-o", ",".join(fields)],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    rows = [dict(zip(fields, line.split("|"))) for line in r.stdout.splitlines() if line.strip()]
    for row in rows:
        row["State"] = (row.get("State") or "UNKNOWN").split()[0]  # "CANCELLED by 0" → CANCELLED
    return rows


def job_state(job_id: str) -> str:
    rows = sacct_rows(job_id)
    if rows:
        return rows[-1]["State"]
    if shutil.which("squeue"):
        r = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True,
                           timeout=30)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.split()[0]
    return "UNKNOWN"


def wait_job(job_id: str, poll_s: float = 2.0, timeout_s: float | None = None) -> str:
    """Poll until the job reaches a final state (a requeued job keeps going); the state."""
    end = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        st = job_state(job_id)
        if st in TERMINAL:
            return st
        if end is not None and time.monotonic() > end:
            return st
        time.sleep(poll_s)


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def squeue_workdir(job_id: str) -> str | None:
    """The working directory of a job still in the queue (sacct may not list it yet)."""
    if not shutil.which("squeue"):
        return None
    try:
        r = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%Z"], capture_output=True, text=True,
                           timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None


def run_dir_of(workdir: Path, job_id: str) -> Path | None:
    """The run a job trains: its working directory when `hpctrain submit` made it (job.json), else
    the record rank 0 leaves under `<workdir>/.hpctrain/` for jobs started with plain sbatch."""
    if (workdir / "job.json").is_file():
        return workdir
    rec = read_json(workdir / ".hpctrain" / f"job-{job_id}.json")
    return Path(rec["run_dir"]) if rec.get("run_dir") and Path(rec["run_dir"]).is_dir() else None


def resolve(target: str, settle_s: float = 15.0) -> tuple[Path | None, str | None, str]:
    """(run dir, job id, executor) for a run directory or a Slurm job id.

    In the first seconds after sbatch the job may be in neither sacct nor squeue yet: ask again
    for up to `settle_s` before calling the id unknown.
    """
    p = Path(target)
    if p.is_dir():
        job = read_json(p / "job.json")
        env = read_json(p / "env.json").get("env", {})
        job_id = job.get("job_id") or env.get("SLURM_JOB_ID")
        return p.resolve(), job_id, job.get("executor") or ("slurm" if job_id else "none")
    if target.isdigit():
        end = time.monotonic() + settle_s
        while True:
            rows = sacct_rows(target)
            work = rows[-1].get("WorkDir") if rows else squeue_workdir(target)
            if rows or work or time.monotonic() > end:
                break
            time.sleep(1.0)
        run = run_dir_of(Path(work), target) if work else None
        if not rows and not work:
            raise LaunchError(f"job {target} is unknown to Slurm (sacct, squeue): check the id, or give "
                              "the run directory instead (runs/<name>)")
        return run, target, "slurm"
    raise LaunchError(f"{target!r} is neither a run directory nor a job id: give runs/<name> or the number "
                      "sbatch printed")


@dataclass
class RunStatus:
    run_dir: Path | None
    job_id: str | None
    executor: str
    state: str
    requeues: int = 0
    nodes: str = ""
    metrics: dict = field(default_factory=dict)

    def text(self) -> str:
        m = self.metrics
        state = self.state
        if m.get("stopped_at") is not None and not m.get("not_requeued"):  # last word: a stop, not an end
            state += f" (stopped at step {m['stopped_at']}: {m.get('stop_reason')}, not resumed yet)"
        if m.get("not_requeued"):
            state += f" (stopped at step {m['not_requeued'][0]} and not requeued: {m['not_requeued'][1]})"
        requeues = str(self.requeues)
        if self.requeues:
            pre, tl = m.get("preemptions", 0), m.get("time_limits", 0)
            requeues += (f" ({pre} after preemption, {tl} after a time limit, "
                         f"{max(0, self.requeues - pre - tl)} other: node failure or outside requeue)")
        rows = [("state", state), ("job", f"{self.job_id or '-'} ({self.executor})"),
                ("run directory", str(self.run_dir or "-")), ("requeues", requeues)]
        if self.nodes:
            rows.append(("nodes", self.nodes))
        if m.get("step") is not None:
            rows.append(("last step", f"{m['step']} (epoch {m.get('epoch', 0):.2f})"))
        if m.get("loss") is not None:
            rows.append(("train loss", f"{m['loss']:.4f}"))
        if m.get("top1") is not None:
            rows.append(("val top-1", f"{m['top1']:.2f} % (step {m['eval_step']})"))
        if m.get("checkpoint"):
            rows.append(("checkpoint", m["checkpoint"]))
        return table(rows, "hpctrain status")


def metrics_summary(run_dir: Path) -> dict:
    out: dict = {}
    for rec in read_metrics(run_dir / "metrics.jsonl"):
        kind = rec.get("kind")
        if kind == "train":
            out.update(step=rec.get("step"), epoch=rec.get("epoch", 0), loss=rec.get("loss"))
        elif kind == "eval":
            out.update(top1=rec.get("top1"), eval_step=rec.get("step"))
        elif kind == "checkpoint":
            out["checkpoint"] = rec.get("path")
        elif kind == "stop":
            out["stops"] = out.get("stops", 0) + 1
            out["stopped_at"], out["stop_reason"] = rec.get("step"), rec.get("stop_kind") or rec.get("reason")
        elif kind == "requeue":
            if rec.get("requeue"):
                key = "preemptions" if rec.get("reason") == "preemption" else "time_limits"
                out[key] = out.get(key, 0) + 1
                out["not_requeued"] = None
            else:
                out["not_requeued"] = (rec.get("step"), rec.get("why"))
        elif kind == "end":
            out["end"] = rec.get("status")
            out["stopped_at"] = None
        if kind in ("train", "eval") and out.get("stopped_at") is not None and rec.get("step", 0) > out["stopped_at"]:
            out["stopped_at"] = None  # resumed past the stop
    return out


def run_status(target: str) -> RunStatus:
    run_dir, job_id, executor = resolve(target)
    metrics = metrics_summary(run_dir) if run_dir else {}
    rows = sacct_rows(job_id) if job_id and executor == "slurm" else []
    if rows:
        state, requeues, nodes = rows[-1]["State"], len(rows) - 1, rows[-1].get("NodeList", "")
    else:  # local runs, or no accounting: what the run itself wrote
        state = {"finished": "COMPLETED"}.get(metrics.get("end"), "UNKNOWN" if job_id else "NO JOB")
        requeues, nodes = metrics.get("stops", 0), ""
    return RunStatus(run_dir, job_id, executor, state, requeues, nodes, metrics)


def wait_for_run(target: str, poll_s: float = 2.0) -> tuple[Path | None, str | None]:
    """(run dir, job id) for `logs -f`: a job started with plain sbatch names its run only once
    rank 0 is up, so wait for that (saying so once) unless the job ends first."""
    run_dir, job_id, _ = resolve(target)
    said = False
    while run_dir is None and job_id and job_state(job_id) not in TERMINAL:
        if not said:
            print(f"hpctrain: waiting for job {job_id} to start and name its run directory …", file=sys.stderr,
                  flush=True)
            said = True
        time.sleep(poll_s)
        run_dir, job_id, _ = resolve(target)
    return run_dir, job_id


def log_path(target: str, rank: int) -> Path:
    """Rank `rank`'s log: <run>/logs/rank-<r>.log, else the task's submitit output."""
    run_dir, job_id, _ = resolve(target)
    if run_dir is None:
        raise LaunchError(f"no run directory known for job {job_id}: give the run directory instead")
    p = run_dir / "logs" / f"rank-{rank}.log"
    if not p.exists() and job_id:
        cand = run_dir / "submitit" / f"{job_id}_{rank}_log.err"
        if cand.exists():
            return cand
    return p


def follow(path: Path, job_id: str | None, poll_s: float = 0.5, out=sys.stdout) -> None:
    """Print the file as it grows (like tail -f) until the job reaches a final state."""
    pos, last_check, done = 0, 0.0, False
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
        if job_id and time.monotonic() - last_check > 2:
            last_check = time.monotonic()
            done = job_state(job_id) in TERMINAL  # one more read after the end
        time.sleep(poll_s)

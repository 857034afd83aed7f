"""What `hpctrain status` shows of a run, as figures: the run's last word on each thing from its
metrics.jsonl records (`summarize`), its job's state (watch/jobinfo.py), progress and ETA
(watch/progress.py) and the steps killed for memory (watch/steps.py), gathered into a `RunStatus`
(`run_status`); watch/render.py writes it as text, `facts()` by machine names. No torch: this runs on
login nodes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from hpctrain.config_moves import current
from hpctrain.run import faultlog, goodput
from hpctrain.run.goodput import Ledger
from hpctrain.run.layout import CONFIG, CONTROL, METRICS
from hpctrain.run.metrics import NONFINITE_FIELDS, read_metrics, total_steps
from hpctrain.watch.follow import TERMINAL, WAITING
from hpctrain.watch.jobinfo import Accounting, accounting, controller_view, local_state, settled_state, where_of
from hpctrain.watch.ledger import allocations_of
from hpctrain.watch.lookup import resolve
from hpctrain.watch.progress import Eta, eta, iso, recent_straggler, steps_per_s
from hpctrain.watch.steps import Step, oom_steps, sacct_steps


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
    goodput: Ledger | None = None  # where the run's time went (run/goodput.py); None before its first step

    def age(self, t: float | None) -> float | None:
        return None if t is None else max(0.0, self.now - t)

    def facts(self) -> dict:
        """Everything `render.status_text` shows, by machine names (`hpctrain status --json`)."""
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
            "resizes": m.get("resizes", 0),
            "last_resize": m.get("last_resize"),
            "goodput": goodput.one_line(self.goodput) if self.goodput else None,
            "out_of_memory": [s.facts() for s in self.oom],
            "last_memory": m.get("memory"),
            "accounting": self.accounting or None,
        }


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


# a requeue record's reason → the count it adds one to (time_limits: any other reason)
REQUEUE_COUNTS: dict[str | None, str | None] = {"preemption": "preemptions", "exclude": None}


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
                key = REQUEUE_COUNTS.get(rec.get("reason"), "time_limits")
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
        elif kind == "resize":  # another world size than the attempt before (run/resize.py)
            out["resizes"] = out.get("resizes", 0) + 1
            out["last_resize"] = {k: v for k, v in rec.items() if k not in ("kind", "time")}
        elif kind in ("restart", "exclude"):  # the batch shell's, on spare nodes or before a requeue (faultlog.py)
            if kind == "restart":
                out["restarts"] = out.get("restarts", 0) + 1
                out["last_restart"] = {
                    k: rec.get(k) for k in ("job", "attempt", "nodes", "why", "decided_at", "fewer_nodes")
                }
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
    ledger = None
    if run_dir:  # this job's allocations (rows): no second sacct call; `hpctrain goodput` asks for every job's
        recs = goodput.run_records(run_dir, records)  # metrics.jsonl as read above
        if any(r.get("kind") == "startup" for r in recs):
            ledger = goodput.build(recs, allocations_of(job_id, rows) if job_id and rows else [], now)
    return RunStatus(run_dir, job_id, executor, state, requeues, nodes, metrics, total, rate, e, now, oom, note, ledger)

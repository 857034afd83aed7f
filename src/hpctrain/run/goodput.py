"""The goodput ledger: where every second of a run went, from its first submission to its end (or now).

Computed from what the run directory and Slurm already hold, never from a clock of its own:
sacct's Submit/Start/End of each allocation (`Allocation`), rank 0's `startup` record of each
process (run/startup.py), the train records' window split (window_s, steps, data_wait_s, ckpt_s,
eval_s, straggler_s), the stop and end records, the batch shell's `restart` records (the step's end
and the decision, run/faultlog.py), and `metrics.superseded.jsonl`: the windows a later attempt
trained again (lost progress). Each category keeps its parts and says where it came from; the
categories are measured separately, so their sum is a check on the ledger, not its definition.

Timeline of one allocation [Start, End], per process (an in-job restart starts another):
  Start → launched (the batch shell: modules, image, probes)       startup.allocation
  launched → process → imports → … → first_batch                   startup.<phase>
  first_batch → the last record, window by window                   productive + data_wait + checkpoint + eval
                                                                   + straggler (+ idle: the gaps between windows)
                                                                   superseded windows: lost
  the last train record → stop / end                               checkpoint + eval + productive (steps after
                                                                   the last window, kept by the stop's save)
  a killed process: the last record → its step's end               lost (half a log window: the steps trained
                                                                   after it, expected) + restart (the detection)
  its step's end (or its last record) → the next process launched  restart
  the last process's end → End                                     idle (after the last step)
Between allocations: Submit → Start is queue; End → the next Submit is idle (between allocations).
Imports no torch (the login node runs it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.run import resize
from hpctrain.run.layout import METRICS, PLAN, atomic_write, read_json
from hpctrain.run.metrics import read_metrics, superseded_path
from hpctrain.run.startup import PHASES

# (category, where its seconds come from): the order of the table and of the report's bars
CATEGORIES = (
    ("queue", "sacct: Submit → Start of each allocation"),
    ("startup", "startup records: the allocation's start (or the step's launch) → the first step, by phase"),
    ("productive", "train records: window_s − data_wait_s − ckpt_s − eval_s − straggler_s, kept windows"),
    ("checkpoint", "train, stop and end records: ckpt_s (saves that blocked training)"),
    ("eval", "train, stop and end records: eval_s"),
    (
        "lost",
        "superseded train windows (trained again after a restart) + half a window after a failed step's last record",
    ),
    ("restart", "restart and startup records: a failed step's last record (+ half a window) → the next step's launch"),
    ("data_wait", "train records: data_wait_s (rank 0 waiting for its loader)"),
    ("straggler", "train records: straggler_s (the slowest rank's own time above the median's)"),
    ("idle", "anything else, by name"),
)
NAMES = tuple(c for c, _ in CATEGORIES)


@dataclass(frozen=True)
class Allocation:
    """One run of a Slurm job (a requeue is another): sacct's row, as Unix times."""

    job: str  # the Slurm job id
    restart: int  # its SLURM_RESTART_COUNT (the row's place among the job's rows)
    submit: float  # sacct Submit: queued (again, after a requeue)
    start: float  # sacct Start: the allocation began
    end: float | None  # sacct End; None while it runs
    state: str = ""  # sacct State


@dataclass
class Ledger:
    """Seconds per category (with parts), the wall time, the allocated time, and the attempts."""

    wall_s: float = 0.0  # the first submission (or the first launch, without Slurm) → the end, or now
    allocated_s: float = 0.0  # Σ allocations' Start → End (without Slurm: the wall time)
    first_queue_s: float = 0.0  # the first allocation's queue wait (ETTR leaves it out)
    allocations: int = 0  # sacct's allocations it was given (0: none, a local run or no accounting)
    parts: dict[str, dict[str, float]] = field(default_factory=lambda: {c: {} for c in NAMES})
    attempts: list[dict[str, Any]] = field(default_factory=list)  # one per process: its own categories
    begin: float = 0.0  # when the wall time starts (Unix time)
    timeline: list[tuple[float, float]] = field(default_factory=list)  # (Unix time, productive seconds so far)
    resizes: list[dict[str, Any]] = field(default_factory=list)  # the run's `resize` records (run/resize.py)

    def add(self, category: str, part: str, seconds: float, attempt: dict | None = None, signed: bool = False) -> None:
        """`seconds` more of `category` (of its `part`); ≤ 0 adds nothing unless `signed` (a correction)."""
        if seconds == 0 or (seconds < 0 and not signed):
            return
        p = self.parts[category]
        p[part] = p.get(part, 0.0) + seconds
        if attempt is not None:
            attempt["seconds"][category] = attempt["seconds"].get(category, 0.0) + seconds

    def total(self, category: str) -> float:
        return sum(self.parts[category].values())

    @property
    def sum_s(self) -> float:
        return sum(self.total(c) for c in NAMES)

    def ratios(self) -> dict[str, float | None]:
        """goodput = productive / wall; runtime = productive / allocated; ETTR (Meta) = productive /
        (wall − the first queue wait): the time the job was scheduled to run, requeue waits included."""
        prod = self.total("productive")

        def of(d: float) -> float | None:
            return prod / d if d > 0 else None

        return {
            "goodput": of(self.wall_s),
            "runtime_goodput": of(self.allocated_s),
            "ettr": of(self.wall_s - self.first_queue_s),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "wall_s": round(self.wall_s, 3),
            "allocated_s": round(self.allocated_s, 3),
            "sum_s": round(self.sum_s, 3),
            **{k: (None if v is None else round(v, 5)) for k, v in self.ratios().items()},
            "categories": {
                c: {
                    "seconds": round(self.total(c), 3),
                    "parts": {k: round(v, 3) for k, v in self.parts[c].items()},
                    "source": src,
                }
                for c, src in CATEGORIES
            },
            "attempts": self.attempts,
            "resizes": self.resizes,
        }


def run_records(run_dir: Path, kept: list[dict] | None = None) -> list[dict]:
    """metrics.jsonl (or `kept`, its records read already) and metrics.superseded.jsonl together, oldest
    first; a superseded record has `superseded: True` (a later attempt trained its steps again)."""
    kept = read_metrics(run_dir / METRICS) if kept is None else kept
    moved = [{**r, "superseded": True} for r in read_metrics(superseded_path(run_dir / METRICS))]
    recs = [r for r in kept + moved if isinstance(r, dict) and isinstance(r.get("time"), (int, float))]
    return sorted(recs, key=lambda r: r["time"])


def _processes(records: list[dict]) -> list[tuple[dict, list[dict]]]:
    """(startup record, the records of that process) per process that took a first step, oldest first.
    A process's records are those from its start to the next process's start."""
    starts = [r for r in records if r.get("kind") == "startup" and r.get("at")]
    out = []
    for i, s in enumerate(starts):
        t0 = _begin(s)
        t1 = _begin(starts[i + 1]) if i + 1 < len(starts) else float("inf")
        out.append((s, [r for r in records if t0 <= r["time"] < t1 and r.get("kind") != "startup"]))
    return out


def _begin(s: dict) -> float:
    """A process's first mark, in the phases' order (launched where the batch shell gave it)."""
    at = s["at"]
    return next((at[p] for p in PHASES if p in at), s["time"])


def _startup(ledger: Ledger, s: dict, since: float | None, att: dict) -> None:
    """The phases of one start-up: `since` (the allocation's start, for its first process) → launched
    → process → … → first_batch. The first step itself is training (its window's)."""
    at = s["at"]
    prev = since
    for phase in PHASES[: PHASES.index("first_batch") + 1]:
        t = at.get(phase)
        if t is None:
            continue
        if prev is not None:  # a mark before the last (clocks of two hosts, /proc's rounding) adds nothing
            ledger.add("startup", "allocation" if phase == "launched" else phase, max(0.0, t - prev), att)
        prev = t if prev is None else max(prev, t)


def _windows(ledger: Ledger, s: dict, recs: list[dict], att: dict) -> tuple[float, dict | None]:
    """The train windows of one process; returns (the time of its last record, its last train record)."""
    at = s["at"]
    first = at.get("first_batch", s["time"])
    # the first window started at `warmup`; its first batch belongs to the start-up
    head = first - at.get("warmup", first)
    # its wait is in the window's data wait or, several ranks, in a later round's median data wait or
    # straggler excess (a rank that waited longest): taken from those as they come, not counted twice
    debt = float(s.get("first_batch_wait_s") or 0.0)
    last_t, last_train = first, None
    for r in recs:
        if r.get("kind") not in ("train", "stop", "end"):
            continue
        # several ranks: the median rank's data wait and the slowest's excess (its straggler round,
        # settled one window late; the stop's or end's record has the last); one: rank 0's data wait
        data = float(r.get("data_wait_median_s", r.get("data_wait_s")) or 0.0)
        st = float(r.get("straggler_s") or 0.0)
        for_data = min(data, debt)
        for_st = min(st, debt - for_data)
        data, st, debt = data - for_data, st - for_st, debt - for_data - for_st
        if r.get("kind") != "train" or "window_s" not in r:
            ledger.add("data_wait", "loader", data, att)
            ledger.add("straggler", "slowest rank over the median", st, att)
            ledger.add("productive", "train windows", -data - st, att, signed=True)  # both were inside the windows
            continue
        win = float(r["window_s"]) - head
        head = 0.0
        ck, ev = (float(r.get(k) or 0.0) for k in ("ckpt_s", "eval_s"))
        ledger.add("checkpoint", "blocking saves", ck, att)
        ledger.add("eval", "evals", ev, att)
        if r.get("superseded"):
            ledger.add("lost", "windows trained again", max(0.0, win - ck - ev), att)
        else:
            ledger.add("data_wait", "loader", data, att)
            ledger.add("straggler", "slowest rank over the median", st, att)
            # not clamped: the straggler round of a window comes with the next one's record
            ledger.add("productive", "train windows", win - data - ck - ev - st, att, signed=True)
            ledger.timeline.append((r["time"], ledger.total("productive")))
        ledger.add("idle", "between log windows", max(0.0, (r["time"] - last_t) - win), att)
        last_t, last_train = r["time"], r
    return last_t, last_train


def _ending(ledger: Ledger, recs: list[dict], last_t: float, last_train: dict | None, att: dict) -> float:
    """A stop's or the end's own seconds after the last window; returns the process's end."""
    fin = next((r for r in recs if r.get("kind") in ("stop", "end") and r["time"] >= last_t), None)
    if fin is None:
        return last_t
    ck, ev = float(fin.get("ckpt_s") or 0.0), float(fin.get("eval_s") or 0.0)
    ledger.add("checkpoint", "the stop's or the end's save", ck, att)
    ledger.add("eval", "the end's eval", ev, att)
    rest = max(0.0, fin["time"] - last_t - ck - ev)
    steps_after = int(fin.get("step") or 0) - int((last_train or {}).get("step") or fin.get("step") or 0)
    step_s = float((last_train or {}).get("step_time_s") or 0.0)
    kept = min(rest, max(0, steps_after) * step_s)  # steps after the last window, kept by the stop's save
    ledger.add("productive", "steps after the last window", kept, att)
    ledger.add("idle", "the stop's or the end's bookkeeping", rest - kept, att)
    att["ended"] = fin.get("kind")
    return fin["time"]


def _step_end(restarts: list[dict], job: str | None, slurm_restart: int, attempt: int) -> float | None:
    """When the batch shell saw the step of this attempt end (its `restart` record), if it restarted it."""
    for r in restarts:
        if (str(r.get("job")), r.get("slurm_restart"), r.get("attempt")) == (str(job), slurm_restart, attempt + 1):
            return r.get("step_ended_at") or r.get("decided_at")
    return None


def build(records: Iterable[dict], allocations: list[Allocation] | None = None, now: float | None = None) -> Ledger:
    """The ledger of a run from its records (`run_records`) and its allocations (sacct; [] or None
    without Slurm: the wall time starts at the first launch)."""
    now = time.time() if now is None else now
    records = list(records)
    restarts = [r for r in records if r.get("kind") == "restart"]
    ledger = Ledger()
    ledger.resizes = [{k: v for k, v in r.items() if k != "kind"} for r in records if r.get("kind") == resize.KIND]
    procs = _processes(records)
    allocs = sorted(allocations or [], key=lambda a: a.start)
    if allocs:
        for i, a in enumerate(allocs):
            ledger.add("queue", f"job {a.job} restart {a.restart}", max(0.0, a.start - a.submit))
            if i:
                ledger.add("idle", "between allocations", max(0.0, a.submit - (allocs[i - 1].end or a.submit)))
            ledger.allocated_s += (a.end or now) - a.start
        ledger.first_queue_s = max(0.0, allocs[0].start - allocs[0].submit)
        ledger.allocations = len(allocs)
        begin, finish = allocs[0].submit, allocs[-1].end or now
    else:
        begin = min((_begin(s) for s, _ in procs), default=now)
        finish = max((r["time"] for r in records), default=begin)
    ledger.wall_s, ledger.begin = max(0.0, finish - begin), begin
    if not allocs:
        ledger.allocated_s = ledger.wall_s

    def until(a: Allocation) -> float:
        """Where an allocation's own time ends: its End, or the next one's Submit where that came first
        (the batch shell's `scontrol requeue` queues the job again before this allocation has ended:
        those seconds are the next queue wait's, by sacct)."""
        later = [b.submit for b in allocs if b.start > a.start]
        return min([a.end or now, *later[:1]])

    def alloc_of(t: float) -> Allocation | None:
        return next((a for a in allocs if a.start - 1 <= t <= (a.end or now) + 1), None)

    prev_end: float | None = None  # the last process's end in the current allocation
    cur: Allocation | None = None
    for s, recs in procs:
        att: dict[str, Any] = {
            "job": s.get("job"),
            "slurm_restart": s.get("slurm_restart"),
            "attempt": s.get("attempt"),
            "step": s.get("step"),
            "seconds": {},
        }
        ledger.attempts.append(att)
        here = alloc_of(_begin(s))
        if here is not cur:  # the first process of an allocation: its start-up counts from Start
            if cur is not None and prev_end is not None:
                ledger.add("idle", "after the last step", max(0.0, until(cur) - prev_end))
            cur = here
            since = here.start if here else None
        else:  # an in-job restart: its step's end → this launch is restart time, its start-up from the launch
            since = None
            if prev_end is not None:
                ledger.add("restart", "a step's end → the next step's launch", max(0.0, _begin(s) - prev_end), att)
        _startup(ledger, s, since, att)
        last_t, last_train = _windows(ledger, s, recs, att)
        end = _ending(ledger, recs, last_t, last_train, att)
        if "ended" not in att:  # killed (or still running): its time after the last record
            ended = _step_end(restarts, s.get("job"), int(s.get("slurm_restart") or 0), int(s.get("attempt") or 0))
            if ended is None and (cur is None or cur.end is None) and s is procs[-1][0]:
                ledger.add("idle", "since the last record (running)", max(0.0, now - end), att)
                end = now
            elif ended is not None and ended > end:
                # trained after the last record, then the failure's detection: the steps after it are
                # unknown, half a log window is their expected share for a failure at a random time
                half = (
                    0.5 * int((last_train or {}).get("steps") or 1) * float((last_train or {}).get("step_time_s") or 0)
                )
                ledger.add("lost", "a failed step after its last record (half a window)", min(ended - end, half), att)
                ledger.add("restart", "the failure → its step's end", max(0.0, ended - end - half), att)
                end = ended
        prev_end = end
    if cur is not None and prev_end is not None and cur.end is not None:
        ledger.add("idle", "after the last step", max(0.0, until(cur) - prev_end))
    for att in ledger.attempts:
        att["seconds"] = {k: round(v, 3) for k, v in att["seconds"].items()}
    return ledger


def one_line(ledger: Ledger) -> str:
    """`hpctrain status`'s line: goodput 87.3 % · runtime 94.1 % · lost to restarts 2.1 % · …"""
    r = ledger.ratios()
    wall = ledger.wall_s or 1.0

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.1f} %"

    bits = [f"goodput {pct(r['goodput'])}", f"runtime {pct(r['runtime_goodput'])}", f"ETTR {pct(r['ettr'])}"]
    lost = ledger.total("lost") + ledger.total("restart")
    if lost:
        bits.append(f"lost to restarts {pct(lost / wall)}")
    for c in ("queue", "startup", "checkpoint", "data_wait"):
        if ledger.total(c) / wall >= 0.005:
            bits.append(f"{c.replace('_', ' ')} {pct(ledger.total(c) / wall)}")
    return " · ".join(bits)


def table(ledger: Ledger) -> str:
    """The ledger as a text table: category, seconds, share of the wall time, its parts."""
    wall = ledger.wall_s or 1.0
    lines = [f"{'category':<12} {'seconds':>10} {'share':>7}  parts"]
    for c in NAMES:
        t = ledger.total(c)
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(ledger.parts[c].items(), key=lambda kv: -kv[1]))
        lines.append(f"{c:<12} {t:>10.1f} {100 * t / wall:>6.1f} %  {parts}")
    lines.append(f"{'sum':<12} {ledger.sum_s:>10.1f} {100 * ledger.sum_s / wall:>6.1f} %  of the wall time")
    lines.append(f"{'wall':<12} {ledger.wall_s:>10.1f}          allocated {ledger.allocated_s:.1f} s")
    # a change of world size costs what its restart and lost progress say; the line says when and why
    lines += [f"{'resized':<12} at step {r.get('step')}: {resize.text(r)}" for r in ledger.resizes]
    lines.append(one_line(ledger))
    return "\n".join(lines)


def keep_plan(run_dir: Path, job: str, predicted: dict, now: float | None = None) -> None:
    """`<run>/plan.json`: the plan's prediction for a submission (plan/recommend.prediction), one per
    job; a resubmission of the run adds its own."""
    old = read_json(run_dir / PLAN, {})
    jobs = old.get("jobs", []) if isinstance(old, dict) else []
    jobs.append({"job": str(job), "submitted_at": round(time.time() if now is None else now, 3), **predicted})
    atomic_write(run_dir / PLAN, json.dumps({"jobs": jobs}, indent=1) + "\n")


def plan_vs_actual(run_dir: Path, ledger: Ledger, records: list[dict]) -> list[dict]:
    """For each figure the first submission's plan predicted: predicted, actual, error (actual −
    predicted, and relative to the prediction). Actual: images/s = the median of the kept train
    records'; queue wait = the first allocation's; interruptions = in-job restarts + requeues that were
    not the run's own stops (a time limit is planned: its stop is not an interruption); time to result
    = the wall time, where the run finished."""
    plan = read_json(run_dir / PLAN, {})
    jobs = plan.get("jobs") if isinstance(plan, dict) else None
    if not jobs:
        return []
    first = jobs[0]
    speeds = sorted(
        r["images_per_s"]
        for r in records
        if r.get("kind") == "train" and not r.get("superseded") and isinstance(r.get("images_per_s"), (int, float))
    )
    finished = any(r.get("kind") == "end" and r.get("status") == "finished" for r in records)
    restarts = sum(1 for r in records if r.get("kind") in ("restart", "exclude"))
    restarts += sum(1 for r in records if r.get("kind") == "stop" and r.get("stop_kind") == "preemption")
    actual = {
        "images_per_s": speeds[len(speeds) // 2] if speeds else None,
        "queue_s": ledger.first_queue_s if ledger.allocations else None,
        "interruptions": restarts,
        "result_s": ledger.wall_s if finished else None,
    }
    out = []
    for key, what in (
        ("images_per_s", "images/s"),
        ("queue_s", "queue wait (s)"),
        ("interruptions", "interruptions"),
        ("result_s", "time to result (s)"),
    ):
        want, got = first.get(key), actual[key]
        err = None if want is None or got is None else got - want
        rel = None if err is None or not want else err / want
        out.append({"figure": what, "key": key, "predicted": want, "actual": got, "error": err, "relative": rel})
    return out


def plan_table(rows: list[dict]) -> str:
    """plan_vs_actual's rows as text: figure, predicted, actual, error."""

    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:,.1f}"

    lines = [f"{'plan vs reality':<20} {'predicted':>12} {'actual':>12} {'error':>12}"]
    for r in rows:
        rel = "" if r["relative"] is None else f" ({100 * r['relative']:+.0f} %)"
        lines.append(f"{r['figure']:<20} {num(r['predicted']):>12} {num(r['actual']):>12} {num(r['error']):>12}{rel}")
    return "\n".join(lines)


def attempt_fields(run_dir: Path, last: dict) -> dict[str, Any]:
    """The `goodput` record's fields for the process that ends now with `last` (its stop or end record,
    about to be written: rank 0 writes the goodput record just before it, so that TensorBoard, MLflow
    and W&B get the ledger per attempt): this process's seconds per category (`<category>_s`) and the
    run's goodput so far. The task reads no sacct: queue waits are not in it (`hpctrain goodput` has them)."""
    led = build([*run_records(run_dir), last])
    if not led.attempts:
        return {}
    secs = led.attempts[-1]["seconds"]
    out: dict[str, Any] = {f"{c}_s": round(secs.get(c, 0.0), 3) for c in NAMES if c != "queue"}
    out["attempt_s"] = round(sum(secs.values()), 3)
    out["run_goodput"] = led.ratios()["goodput"]
    out["attempts"] = len(led.attempts)
    return out

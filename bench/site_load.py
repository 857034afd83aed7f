#!/usr/bin/env python3
"""What one hpctrain job costs a site: Slurm calls (slurmctld and slurmdbd) per minute by where
they come from, and metadata operations per second in the run directory (the parallel file
system's metadata server), measured on this repository's Slurm test cluster and extrapolated to
16 and 128 nodes (docs/sites.md, "What hpctrain costs your cluster").

Root only (the test cluster: tests/slurm_cluster.py). The job: the digits config on 2 nodes × 2
tasks plus 1 spare node (the spares partition, so the batch shell's guard runs), long enough for a
steady state.

- Slurm calls are counted by wrappers first on PATH for every Slurm client (sbatch, squeue, sacct,
  scontrol, sinfo, sacctmgr, scancel, srun): each appends one JSON line and runs the real one. They
  count whatever the code does, its own call log ($HPCTRAIN_SLURM_CALL_LOG) or not, so figures of an
  older checkout compare with today's. Where a call came from: the login node (no $SLURM_JOB_ID), a
  task (its parent is a Python: the training) or the batch shell (anything else in the job: the
  batch script and the steps it runs for itself, such as the guard).
- Phases on the login node: a first `submit --dry-run` on an empty cache (what any first submission
  asks), then `submit --wait` within the cache's life: its calls up to the sbatch are the second
  submission's, those after it the waiting.
- File-system operations: inotify (through ctypes) on the run directory and every directory created
  under it: creates, deletes, renames, opens and attribute changes, which a parallel file system
  serves from its metadata server. A stat (no inotify event) is not counted here: the tests of the
  heartbeat reader count those by wrapping. Each file is put in a family (its path with digits
  replaced by #): a family with one file per rank scales with the ranks, one per node with the nodes,
  anything else stays per job; that is how 16 and 128 nodes × 8 GPUs are extrapolated.

    python bench/site_load.py [--epochs 12] [--out bench/results/site_load-after.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from hpctrain.config import load  # noqa: E402
from hpctrain.train.stop import END_FILE_POLL_S  # noqa: E402

try:  # node heartbeat files (0.5.0); a checkout before them (the "before" figures) writes one per rank
    from hpctrain.train.health.watchdog import heartbeat_period, tick
except ImportError:
    heartbeat_period = tick = None  # type: ignore[assignment]
from tests.fs_events import Inotify  # noqa: E402
from tests.slurm_cluster import SPARE_PARTITION, SlurmCluster  # noqa: E402

CLIENTS = ("sbatch", "squeue", "sacct", "scontrol", "sinfo", "sacctmgr", "scancel", "srun")
NODES, TASKS_PER_NODE, SPARES = 2, 2, 1
SCALES = ((16, 8), (128, 8))  # (nodes, GPUs per node) the figures are extrapolated to

WRAPPER = """#!{python}
import json, os, subprocess, sys, time
t0 = time.time()
rc = subprocess.call([{real!r}, *sys.argv[1:]])
env = os.environ
with open(f"/proc/{{os.getppid()}}/cmdline", "rb") as f:
    parent = f.read().split(b"\\0")[0]
where = "login" if not env.get("SLURM_JOB_ID") else "task" if b"python" in os.path.basename(parent) else "batch"
line = json.dumps({{"t": t0, "kind": {kind!r}, "args": sys.argv[1:], "s": round(time.time() - t0, 3), "rc": rc,
                   "where": where, "phase": env.get("SITE_LOAD_PHASE", "")}})
fd = os.open({log!r}, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
os.write(fd, (line + "\\n").encode())
os.close(fd)
sys.exit(rc)
"""


def counting_clients(bin_dir: Path, log: Path, path: str) -> None:
    """A wrapper per Slurm client in `bin_dir` that logs each call to `log` and runs the real one."""
    bin_dir.mkdir(parents=True)
    for kind in CLIENTS:
        real = shutil.which(kind, path=path)
        if real is None:
            raise SystemExit(f"site_load: no {kind} on PATH: install slurm-client (the test cluster's)")
        w = bin_dir / kind
        w.write_text(WRAPPER.format(python=sys.executable, real=real, kind=kind, log=str(log)))
        w.chmod(0o755)


def family(path: str) -> str:
    """A file's family: its path with every run of digits replaced by # (rank-3.json → rank-#.json)."""
    return re.sub(r"\d+", "#", path)


def fused(events: list[tuple[float, str, str]]) -> list[tuple[float, str, str]]:
    """The events without the open that comes with each create (inotify reports both for an open with
    O_CREAT, which is one request); a later open of the file counts."""
    out, just_created = [], set()
    for e in events:
        _, op, path = e
        if op == "open" and path in just_created:
            just_created.discard(path)
            continue
        just_created.discard(path)
        if op == "create":
            just_created.add(path)
        out.append(e)
    return out


def fs_figures(
    events: list[tuple[float, str, str]],
    nodes: int,
    ranks: int,
    period_s: float | None = None,
    period_at: Callable[[int], float] | None = None,
) -> dict:
    """Metadata operations per second in the steady state (the middle 60 % of the span of events),
    by family and scaling, and extrapolated to SCALES; the open of a create is part of it (`fused`).
    `period_s`: the period the node heartbeat files were written at here, `period_at(n)` the one
    hpctrain picks for n nodes: a heartbeat family's rate is carried over by their ratio too."""
    if not events:
        return {"ops_per_s": 0.0, "families": {}, "extrapolated": {}}
    t0, t1 = events[0][0], events[-1][0]
    lo, hi = t0 + 0.2 * (t1 - t0), t0 + 0.8 * (t1 - t0)
    events = fused(events)
    steady = [e for e in events if lo <= e[0] <= hi]
    span = max(hi - lo, 1e-9)
    files: dict[str, set[str]] = defaultdict(set)
    ops: Counter = Counter()
    for _, op, path in steady:
        files[family(path)].add(path)
        ops[(family(path), op)] += 1
    fams = {}
    for fam, members in sorted(files.items()):
        n = len(members)
        scale = "rank" if n == ranks and ranks != nodes else "node" if n == nodes else "job"
        fams[fam] = {
            "files": n,
            "scales_with": scale,
            "period_scaled": bool(period_s and period_at and "heartbeat" in fam),
            "ops_per_s": {op: round(c / span, 3) for (f, op), c in sorted(ops.items()) if f == fam},
        }
    per = {"rank": ranks, "node": nodes, "job": 1}
    out = {}
    for n_nodes, gpn in SCALES:
        unit = {"rank": n_nodes * gpn, "node": n_nodes, "job": 1}
        total = 0.0
        for f in fams.values():
            rate = sum(f["ops_per_s"].values()) * unit[f["scales_with"]] / per[f["scales_with"]]
            if f["period_scaled"]:
                rate *= period_s / period_at(n_nodes)  # type: ignore[misc, operator]
            total += rate
        out[f"{n_nodes}x{gpn}"] = round(total, 2)
    whole: Counter = Counter(family(path) for _, _, path in events)
    return {
        "whole_run_ops": dict(sorted(whole.items())),
        "ops_per_s": round(len(steady) / span, 3),
        "steady_s": round(span, 1),
        "families": fams,
        "extrapolated": out,
    }


def unseen_stats(nodes: int, period_s: float) -> float:
    """Stats a second that inotify cannot see, from the code's own periods: each node's writer stats
    logs/hang.json once a publish, rank 0 the batch shell's end file every END_FILE_POLL_S."""
    return nodes / period_s + 1 / END_FILE_POLL_S


# --------------------------------------------------------------------------- the job


def read_calls(log: Path) -> list[dict]:
    return [json.loads(ln) for ln in log.read_text().splitlines() if ln.strip()] if log.exists() else []


def rpc(call: dict) -> bool:
    """Whether a client call reaches slurmctld or slurmdbd: `--version` and `scontrol show hostnames`
    answer from the client alone."""
    args = call["args"]
    return "--version" not in args and args[:2] != ["show", "hostnames"]


def by_kind(calls: list[dict]) -> dict[str, int]:
    return dict(sorted(Counter(c["kind"] for c in calls).items()))


def per_minute(n: int, seconds: float) -> float:
    return round(60 * n / seconds, 2) if seconds > 0 else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=100, help="digits epochs of the job (its length)")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the cluster's and the run's directory")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("site_load: runs the Slurm test cluster, which needs root")
    work = Path(tempfile.mkdtemp(prefix="site-load-"))
    work.chmod(0o755)
    cluster = SlurmCluster(root=work / "cluster").start()
    try:
        return measure(cluster, work, a)
    finally:
        cluster.stop()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


def measure(cluster: SlurmCluster, work: Path, a: argparse.Namespace) -> int:
    log, runs, digits = work / "calls.jsonl", work / "runs", work / "digits"
    base = cluster.environ()
    counting_clients(work / "bin", log, base["PATH"])
    subprocess.run(
        [sys.executable, "-m", "hpctrain", "data", "digits", str(digits)], check=True, capture_output=True, env=base
    )
    runs.mkdir()
    env = {
        **base,
        "PATH": f"{work / 'bin'}{os.pathsep}{base['PATH']}",
        "HPCTRAIN_CLUSTER": "local",
        "XDG_CACHE_HOME": str(work / "cache"),  # an empty cache: the first submission asks Slurm everything
        "HPCTRAIN_SLURM_CALL_LOG": str(work / "hpctrain-calls.jsonl"),
        "PYTHONPATH": str(ROOT / "src"),
    }
    cmd = [sys.executable, "-m", "hpctrain", "submit", "--config", "digits_vit", "--nodes", str(NODES)]
    cmd += ["--gpus-per-node", str(TASKS_PER_NODE), "--spare-nodes", str(SPARES), "--partition", SPARE_PARTITION]
    cmd += ["--time", "30"]
    for s in (
        f"data.root={digits}",
        f"run.dir={runs}",
        "run.name=site-load",
        f"train.epochs={a.epochs}",
        "train.threads=1",
        "log.every=10",
        "train.eval_every_epochs=0",
        "ckpt.every=0",
    ):
        cmd += ["--set", s]
    t = time.time()
    r = subprocess.run([*cmd, "--dry-run"], env={**env, "SITE_LOAD_PHASE": "first"}, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"site_load: the dry run failed:\n{r.stdout}{r.stderr}")
    first_s = time.time() - t
    watcher = Inotify(runs)
    t_submit = time.time()
    r = subprocess.run([*cmd, "--wait"], env={**env, "SITE_LOAD_PHASE": "second"}, capture_output=True, text=True)
    t_end = time.time()
    events = watcher.close()
    print(r.stdout[-2000:], r.stderr[-2000:], sep="\n")
    every = read_calls(log)
    calls = [c for c in every if rpc(c)]
    m = re.search(r"submitted Slurm job (\d+)", r.stdout)
    if r.returncode or not m:
        raise SystemExit(f"site_load: the job failed (exit {r.returncode}); calls so far: {by_kind(calls)}")
    job = m[1]
    login = [c for c in calls if c["where"] == "login"]
    sbatch_t = next(
        c["t"] for c in login if c["kind"] == "sbatch" and c["phase"] == "second" and "--test-only" not in c["args"]
    )
    first = [c for c in login if c["phase"] == "first"]
    second = [c for c in login if c["phase"] == "second" and c["t"] <= sbatch_t]
    waiting = [c for c in login if c["phase"] == "second" and c["t"] > sbatch_t]
    wait_s = t_end - sbatch_t
    row = cluster.run("sacct", "-n", "-X", "-P", "-j", job, "-o", "ElapsedRaw,End", env={"SLURM_TIME_FORMAT": "%s"})
    elapsed, ended = (row.stdout.split() or ["|"])[0].split("|")
    job_s = float(elapsed) if elapsed.isdigit() else wait_s
    job_end = float(ended) if ended.isdigit() else t_end
    batch = [c for c in calls if c["where"] == "batch"]
    # the batch shell's steady state: from 30 s after the training step started to the job's end
    step_t = next((c["t"] for c in batch if c["kind"] == "srun" and "hpctrain.launch.task" in c["args"]), job_end)
    steady = [c for c in batch if step_t + 30 <= c["t"] <= job_end]
    steady_s = job_end - step_t - 30
    env_json = json.loads((runs / "site-load" / "env.json").read_text())
    period = (env_json.get("resolved") or {}).get("heartbeat_period_s")
    timeout = load(str(runs / "site-load" / "config.yaml")).hang_s
    period_at = (lambda n: heartbeat_period(n, tick(timeout))) if period else None
    task = [c for c in calls if c["where"] == "task"]
    ranks = NODES * TASKS_PER_NODE
    fig = {
        "commit": subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "job": {
            "nodes": NODES,
            "tasks_per_node": TASKS_PER_NODE,
            "spares": SPARES,
            "seconds": job_s,
            "epochs": a.epochs,
        },
        "slurm_calls": {
            "submission_first": {"calls": len(first), "by_kind": by_kind(first), "seconds": round(first_s, 1)},
            "submission_second": {"calls": len(second), "by_kind": by_kind(second)},
            "waiting": {
                "calls": len(waiting),
                "per_min": per_minute(len(waiting), wait_s),
                "by_kind": by_kind(waiting),
            },
            "batch_shell": {"calls": len(batch), "per_min": per_minute(len(batch), job_s), "by_kind": by_kind(batch)},
            "batch_shell_steady": {
                "calls": len(steady),
                "seconds": round(steady_s),
                "per_min": per_minute(len(steady), steady_s),
                "by_kind": by_kind(steady),
            },
            "tasks": {"calls": len(task), "per_min": per_minute(len(task), job_s), "by_kind": by_kind(task)},
        },
        "file_system": fs_figures(events, NODES, ranks, period, period_at),
        "command": "python bench/site_load.py" + (f" --epochs {a.epochs}" if a.epochs != 100 else ""),
    }
    fig["calls"] = [
        {
            "t": round(c["t"] - t_submit, 1),
            "where": c["where"],
            "phase": c["phase"],
            "rpc": rpc(c),
            "argv": [c["kind"], *c["args"]],
        }
        for c in every
    ]
    if period:  # what inotify does not see: the stats, from the code's own periods
        fs = fig["file_system"]
        fs["unseen_stats_per_s"] = {
            f"{n}x{g}": round(unseen_stats(n, period_at(n)), 2)
            for n, g in SCALES  # type: ignore[misc]
        }
        fs["heartbeat_period_s"] = {f"{n}x{g}": period_at(n) for n, g in SCALES}  # type: ignore[misc]
    own = read_calls(work / "hpctrain-calls.jsonl")
    fig["own_call_log"] = {"lines": len(own), "calls": sum(not c.get("cached") for c in own)}
    print(table(fig))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(fig, indent=1) + "\n")
    return 0


def table(fig: dict) -> str:
    """The figures as docs/sites.md shows them."""
    s, f = fig["slurm_calls"], fig["file_system"]
    j = fig["job"]
    rows = [
        f"job: {j['nodes']} nodes × {j['tasks_per_node']} tasks + {j['spares']} spare, {j['seconds']:.0f} s",
        f"first submission (empty cache): {s['submission_first']['calls']} calls {s['submission_first']['by_kind']}",
        f"second submission (cache warm): {s['submission_second']['calls']} calls {s['submission_second']['by_kind']}",
        f"waiting (submit --wait):        {s['waiting']['per_min']} calls/min {s['waiting']['by_kind']}",
        f"batch shell:                    {s['batch_shell']['per_min']} calls/min {s['batch_shell']['by_kind']}",
        f"  steady state:                 {s['batch_shell_steady']['per_min']} calls/min over "
        f"{s['batch_shell_steady']['seconds']} s {s['batch_shell_steady']['by_kind']}",
        f"tasks:                          {s['tasks']['per_min']} calls/min",
        f"run directory, steady state:    {f['ops_per_s']} metadata ops/s over {f.get('steady_s', 0)} s",
    ]
    rows += [
        f"  {fam} ({d['files']} file(s), per {d['scales_with']}): {d['ops_per_s']}" for fam, d in f["families"].items()
    ]
    unseen = f.get("unseen_stats_per_s", {})
    rows += [
        f"  extrapolated to {k} GPUs: {v} ops/s" + (f" + {unseen[k]} stats/s inotify cannot see" if k in unseen else "")
        for k, v in f["extrapolated"].items()
    ]
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())

"""The batch shell's in-job restarts and node exclusions, turned into metrics records by rank 0.

The shell (launch.inplace) cannot write metrics.jsonl: it does not know the run directory, and
only rank 0 writes that file. It appends one line per event to `$HPCTRAIN_FAULTS_FILE` (one file
per Slurm job, kept across requeues): `time, restart count, attempt, action, nodes, why, step end`,
tab-separated. At start-up rank 0 writes each line it has not recorded yet as a `restart` record
(the job went on in place; `fewer_nodes` where a node range went on with the nodes left), an
`exclude` record (requeued without the nodes) or an `fs_stall` record (the run directory took no
probe's write: no node was left out for it).
The shell also keeps every node it leaves out in `.hpctrain/excluded-<job>` (`time, node, why`;
launch/shell/exclude.sh), written at once: `hpctrain status` reads it (`excluded`), so a node left out
before a requeue is named while the job waits in the queue, before any rank records it.
Imports no torch: `hpctrain status` reads the records on a login node. It lives below `launch/`
(the shell's side and status) and `train/` (rank 0 records the lines).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpctrain.run.badnodes import NODE_NAME

ENV = "HPCTRAIN_FAULTS_FILE"
# the shell's action → the record's kind; `shrink`: a restart on fewer nodes (a node range, no spare free)
KINDS = {"restart": "restart", "shrink": "restart", "requeue": "exclude", "fs_stall": "fs_stall"}


def _seconds(text: str) -> float | int | None:
    """A Unix time as the shell writes it: whole seconds (lines of older jobs) or with microseconds
    (`hpctrain_now`: the restart test's phase table splits seconds)."""
    whole, dot, frac = text.partition(".")
    if not whole.isdigit() or (dot and not frac.isdigit()):
        return None
    return round(float(text), 3) if dot else int(whole)


def parse(text: str, job: str) -> list[dict[str, Any]]:
    """The records of the file's well-formed lines, oldest first."""
    out = []
    for line in text.splitlines():
        f = line.split("\t")
        if len(f) != 7 or f[3] not in KINDS or not (_seconds(f[0]) is not None and f[1].isdigit() and f[2].isdigit()):
            continue
        nodes = [n for n in f[4].split(",") if NODE_NAME.fullmatch(n)]
        rec: dict[str, Any] = {
            "job": job,
            "slurm_restart": int(f[1]),
            "attempt": int(f[2]),
            "nodes": nodes,
            "why": f[5],
            "decided_at": _seconds(f[0]),
        }
        if _seconds(f[6]) is not None:
            rec["step_ended_at"] = _seconds(f[6])
        if f[3] == "shrink":
            rec["fewer_nodes"] = True
        out.append({"kind": KINDS[f[3]], **rec})
    return out


def key(rec: Mapping[str, Any]) -> tuple:
    return rec.get("kind"), str(rec.get("job")), rec.get("slurm_restart"), rec.get("attempt")


def record_new(metrics, records: list[dict], env: Mapping[str, str] | None = None) -> list[dict]:
    """Write the shell's events that `records` (the run's metrics so far) lack; returns them."""
    env = os.environ if env is None else env
    path, job = env.get(ENV), env.get("SLURM_JOB_ID")
    if not path or not job:
        return []
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return []
    seen = {key(r) for r in records if r.get("kind") in KINDS.values()}
    new = [r for r in parse(text, job) if key(r) not in seen]
    for r in new:
        metrics.write(r["kind"], **{k: v for k, v in r.items() if k != "kind"})
    return new


def excluded_path(control_dir: str | Path, job: str) -> Path:
    """The batch shell's exclusions of one job (exclude.sh's $HPCTRAIN_EXCLUDED_FILE)."""
    return Path(control_dir) / f"excluded-{job}"


def read_excluded(path: str | Path) -> dict[str, tuple[int, str]]:
    """{node: (when, why)} from an exclusions file, the first line of each node; malformed lines skipped."""
    out: dict[str, tuple[int, str]] = {}
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        f = line.split("\t")
        if len(f) == 3 and f[0].isdigit() and NODE_NAME.fullmatch(f[1]) and f[1] not in out:
            out[f[1]] = (int(f[0]), f[2])
    return out

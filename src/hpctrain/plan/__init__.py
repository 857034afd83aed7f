"""`hpctrain plan`: what a job will cost before it is submitted, and when its result comes.
Torch-free: runs on login nodes. One concern per module:

- `model`: the step-time arithmetic (compute + exposed all-reduce + data wait); `tables`: the public
  figures it falls back on;
- `throughput`: the model's inputs (measured by `hpctrain bench --json` / `hpctrain doctor
  --allreduce --json`, given, or public) → a `Plan` of training time per node count;
- `render`: that plan as the table, its assumptions, JSON, and `submit --dry-run`'s summary;
- `queue`: the partition's sacct history, squeue and sinfo → queue wait per node count;
- `interruptions`: preemptions/node failures per node-hour → expected lost work;
- `allocation`: sshare and sacctmgr's GrpTRESMins → share of the remaining allocation;
- `recommend`: the per-node-count rows of time to result and the recommendation;
- `ranges`: a node range (`--nodes 12-16`) against a fixed MAX, and which of them pays.

docs/plan.md states the assumptions and the source of every figure. This face re-exports the
training-time API (`hpctrain plan` without the queue, `plan.ckpt_cost`); the queue-aware modules
are imported by name (they read Slurm through `launch`, which imports this package).
"""

from __future__ import annotations

from hpctrain.plan.render import assumptions, describe, summary, summary_lines, to_dict
from hpctrain.plan.throughput import (
    PlanError,
    PlanInputs,
    build,
    compute_from_bench,
    compute_from_table,
    default_links,
    grad_bytes,
    images_per_epoch,
    link_from_doctor,
    link_from_rows,
    resolve,
    workload,
)

__all__ = [
    "PlanInputs",
    "PlanError",
    "assumptions",
    "build",
    "compute_from_bench",
    "compute_from_table",
    "default_links",
    "describe",
    "grad_bytes",
    "images_per_epoch",
    "link_from_doctor",
    "link_from_rows",
    "resolve",
    "summary",
    "summary_lines",
    "to_dict",
    "workload",
]

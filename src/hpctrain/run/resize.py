"""A run that changes its world size between attempts writes a `resize` record (docs/launch.md, "Node
ranges and fewer nodes").

A node range (`--nodes MIN-MAX`) lets an attempt train on whatever Slurm gave, and a ranged job goes on
with fewer nodes after a node is lost and no spare is free (launch/shell/step_next.sh). Each attempt's
size is in its env.json (`resolved`: world_size, accum_steps, nodes); rank 0 compares the previous
attempt's with its own before it overwrites the file, and records the change with why: the batch
shell's restart line of this attempt (a lost node), else a new allocation (a requeue that got
another node count). Torch-free: `hpctrain status` reads the records on a login node.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpctrain.run.layout import ENV

KIND = "resize"
SIZE_KEYS = ("world_size", "accum_steps", "nodes")


def previous_size(run_dir: Path) -> dict[str, int] | None:
    """The last attempt's size from its env.json (None: no attempt before, or one too old to say)."""
    try:
        resolved = json.loads((run_dir / ENV).read_text()).get("resolved") or {}
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(resolved.get("world_size"), int):
        return None
    return {k: int(resolved[k]) for k in SIZE_KEYS if isinstance(resolved.get(k), int)}


def nodes_of(env: Mapping[str, str]) -> int:
    """The step's node count as srun gives it to a task (1 outside Slurm)."""
    for var in ("SLURM_STEP_NUM_NODES", "SLURM_NNODES"):
        if env.get(var, "").isdigit():
            return int(env[var])
    return 1


def change(
    before: Mapping[str, int] | None, now: Mapping[str, int], restarts: list[dict], env: Mapping[str, str]
) -> dict | None:
    """The `resize` record's fields, or None where the world size did not change. `restarts`: the
    shell's restart records written at this start (faultlog.record_new): this attempt's says why."""
    if not before or before.get("world_size") == now["world_size"]:
        return None
    attempt = int(env.get("HPCTRAIN_ATTEMPT") or 0)
    own = [r for r in restarts if r.get("kind") == "restart" and r.get("attempt") == attempt]
    if own:
        why = own[-1].get("why", "")
    else:
        why = f"a new allocation of {now.get('nodes', '?')} node(s) (Slurm job {env.get('SLURM_JOB_ID', '-')})"
    rec: dict[str, Any] = {f"{k}_before": before[k] for k in SIZE_KEYS if k in before}
    rec.update({k: now[k] for k in SIZE_KEYS if k in now})
    rec.update(job=env.get("SLURM_JOB_ID"), why=why)
    return rec


def text(rec: Mapping[str, Any]) -> str:
    """One line for `status` and the log: `3 → 2 nodes (world 6 → 4, accumulation 1 → 1): why`."""
    return (
        f"{rec.get('nodes_before', '?')} → {rec.get('nodes', '?')} nodes (world {rec.get('world_size_before', '?')} → "
        f"{rec.get('world_size', '?')}, accumulation {rec.get('accum_steps_before', '?')} → "
        f"{rec.get('accum_steps', '?')}): {rec.get('why', '')}"
    )

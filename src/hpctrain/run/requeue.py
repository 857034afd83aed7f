"""After a stop signal: should this Slurm job be requeued, and by whom.

The decision is taken by rank 0 inside the job (it knows the run's history) and carried out by
the batch shell outside the container: images from NGC or pytorch have no Slurm client, munge
socket or slurm.conf, so the task's Python never calls `scontrol` (docs/architecture.md). Rank 0 writes
the decision to `$HPCTRAIN_STOP_FILE` (two lines: `requeue` or `end`, then why) once the
checkpoint is on disk; the batch script reads it after `srun` returns and runs `scontrol requeue`
while the job is still RUNNING (a job Slurm is already requeueing or cancelling is left alone).
This matters for preemption too: a job of a `PreemptMode=REQUEUE` partition that exits within
its GraceTime ends COMPLETED and is *not* requeued by Slurm (measured on Slurm 22.05).

Budgets, per Slurm job: preemptions (SIGTERM) count against `slurm.max_preemptions` (-1:
unlimited); every other restart — a time limit (USR2), a node failure, an outside requeue that
left no checkpoint — against `slurm.max_requeues`. `SLURM_RESTART_COUNT` counts all restarts;
the preemptions are the run's own `requeue` records for this job, so the rest is the difference.
Nodes that die are left to Slurm (`--requeue`) and the batch shell: the survivors cannot tell a
dead node from a crashed rank, and rank 0 may be on the dead node. With hot spares (`--no-kill`)
the shell restarts the step on other nodes of the job instead (launch.inplace); a stop of kind
`exclude` (a node the tasks named: a persistent straggler) is decided here like a time limit.

The stop-file protocol, shared by the task (train.entry decides) and the batch shell (launch.sbatch
reads the file): it lives below both launch and train.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpctrain.errors import LaunchError
from hpctrain.run.layout import METRICS
from hpctrain.run.metrics import read_metrics

log = logging.getLogger("hpctrain")
DEFAULT_MAX_REQUEUES = 3
UNLIMITED = -1


@dataclass(frozen=True)
class Budget:
    """Where a Slurm job stands against its requeue caps."""

    job_id: str
    restarts: int  # SLURM_RESTART_COUNT: requeues of this job so far, for any reason
    preemptions: int  # of those, the ones after a preemption stop (from the run's records)
    max_requeues: int
    max_preemptions: int  # -1: unlimited
    spares_free: int = 0  # healthy spare nodes the batch shell has left (HPCTRAIN_SPARES_FREE)

    @property
    def others(self) -> int:
        """Restarts that were not preemptions: time limits, node failures, outside requeues."""
        return max(0, self.restarts - self.preemptions)


def preemptions(run_dir: Path, job_id: str) -> int:
    """Requeues after preemption already taken by this job (rank 0's `requeue` records)."""
    return sum(
        1
        for r in read_metrics(run_dir / METRICS)
        if r.get("kind") == "requeue"
        and str(r.get("job")) == job_id
        and r.get("reason") == "preemption"
        and r.get("requeue")
    )


def budget(run_dir: Path, env: Mapping[str, str] | None = None) -> Budget | None:
    """This job's budget; None outside a Slurm job."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    return Budget(
        job,
        int(env.get("SLURM_RESTART_COUNT") or 0),
        preemptions(run_dir, job),
        int(env.get("HPCTRAIN_MAX_REQUEUES") or DEFAULT_MAX_REQUEUES),
        int(env.get("HPCTRAIN_MAX_PREEMPTIONS") or UNLIMITED),
        int(env.get("HPCTRAIN_SPARES_FREE") or 0),
    )


def decide(kind: str, b: Budget) -> tuple[bool, str]:
    """(requeue?, why) after a stop of `kind` (preemption | time_limit | exclude | halt)."""
    if kind == "halt":
        return False, "HPCTRAIN_HALT_AT reached (a test's planned stop, not requeued)"
    if kind == "exclude":  # the batch shell runs on without the named node: on spares, else by this requeue
        if b.spares_free > 0:  # an in-job restart, not a requeue: no budget spent
            return True, f"restarting job {b.job_id} without a straggling node on a spare ({b.spares_free} free)"
        if b.others >= b.max_requeues:
            return False, (
                f"job {b.job_id} was requeued {b.others} times already for time limits or failures "
                f"(slurm.max_requeues={b.max_requeues}); a straggling node is left in"
            )
        return True, (
            f"requeueing job {b.job_id} without a straggling node, or restarting it on a spare "
            f"({b.others + 1}/{b.max_requeues})"
        )
    if kind == "preemption":
        if 0 <= b.max_preemptions <= b.preemptions:
            return False, (
                f"job {b.job_id} was preempted and requeued {b.preemptions} times already "
                f"(slurm.max_preemptions={b.max_preemptions})"
            )
        cap = "" if b.max_preemptions < 0 else f"/{b.max_preemptions}"
        return True, f"requeueing job {b.job_id} after preemption {b.preemptions + 1}{cap}"
    if b.others >= b.max_requeues:
        return False, (
            f"job {b.job_id} was requeued {b.others} times already for time limits or failures "
            f"(slurm.max_requeues={b.max_requeues})"
        )
    return True, f"requeueing job {b.job_id} after its time limit ({b.others + 1}/{b.max_requeues})"


def check_budget(b: Budget | None) -> None:
    """Refuse to start a run whose job was restarted past its caps (Slurm requeues node failures
    and preemptions on its own, uncapped). LaunchError: the CLI prints it as one line."""
    if b is None:
        return
    if b.others > b.max_requeues:
        raise LaunchError(
            f"job {b.job_id} was restarted {b.others} times for time limits or failures "
            f"(slurm.max_requeues={b.max_requeues}); giving up here: find out why its nodes fail, then "
            "resubmit to resume from the last checkpoint"
        )
    if 0 <= b.max_preemptions < b.preemptions:
        raise LaunchError(
            f"job {b.job_id} was preempted {b.preemptions} times (slurm.max_preemptions={b.max_preemptions}); "
            "giving up here: resubmit to a partition that is not preempted, or raise the cap"
        )


def write_decision(path: str | Path, requeue: bool, why: str) -> None:
    """The file the batch shell reads after srun: `requeue`|`end`, then why (one line each)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(f"{'requeue' if requeue else 'end'}\n{' '.join(why.split())}\n")
    os.replace(tmp, p)


def after_stop(summary: Mapping, metrics=None, env: Mapping[str, str] | None = None) -> bool:
    """Called on every rank after `run()` returned. True when the batch shell will requeue the job:
    the caller then exits 0 without a final result (the job runs again from the checkpoint)."""
    env = os.environ if env is None else env
    if summary.get("status") != "preempted":
        return False
    stop_file = env.get("HPCTRAIN_STOP_FILE")
    kind = summary.get("stop_kind") or "time_limit"
    if not stop_file or not env.get("SLURM_JOB_ID"):
        if summary.get("rank") == 0:
            log.warning(
                "stopped at step %s (%s); not under an hpctrain batch script, so nothing requeues "
                "it: run the same command again to resume (--resume auto)",
                summary.get("step"),
                kind,
            )
        return False
    b = budget(Path(summary["run_dir"]), env)
    ok, why = decide(kind, b)
    if summary.get("rank") == 0:
        (log.warning if ok else log.error)("stopped at step %s (%s): %s", summary.get("step"), kind, why)
        if metrics is not None:
            metrics.write(
                "requeue", step=summary.get("step"), job=b.job_id, reason=kind, requeue=ok, why=why, restarts=b.restarts
            )
        write_decision(stop_file, ok, why)
    return ok

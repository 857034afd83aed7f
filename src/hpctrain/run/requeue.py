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
unlimited); `slurm.max_requeues` is the crash-loop guard: it counts only the attempts that ended
without progress, i.e. without a checkpoint newer than the one they started from. A run that needs
twenty time-limit windows, each of which checkpointed, spends none of it; nor does an admin's
`scontrol requeue` or a node failure after progress. What each attempt started from is in the
progress ledger, `$HPCTRAIN_CONTROL_DIR/progress-<job id>`: one line per Slurm attempt
(`<SLURM_RESTART_COUNT> TAB <checkpoints/latest, or -> TAB <checkpoints dir>`), appended at the
attempt's start by the batch shell (once it knows the run: progress.sh) or by rank 0, the first
line of a restart standing. An attempt with no line crashed before rank 0 started: no progress.
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
from hpctrain.run.layout import CHECKPOINTS, METRICS
from hpctrain.run.metrics import read_metrics

log = logging.getLogger("hpctrain")
DEFAULT_MAX_REQUEUES = 3
UNLIMITED = -1
PROGRESS = "progress-{}"  # in $HPCTRAIN_CONTROL_DIR: the progress ledger of a Slurm job (by id)
NO_CHECKPOINT = "-"  # the ledger's word for "no checkpoint yet"


@dataclass(frozen=True)
class Budget:
    """Where a Slurm job stands against its requeue caps."""

    job_id: str
    restarts: int  # SLURM_RESTART_COUNT: requeues of this job so far, for any reason
    preemptions: int  # of those, the ones after a preemption stop (from the run's records)
    max_requeues: int
    max_preemptions: int  # -1: unlimited
    spares_free: int = 0  # healthy spare nodes the batch shell has left (HPCTRAIN_SPARES_FREE)
    stalled: int | None = None  # earlier attempts that ended without progress, not preempted (None: no ledger)
    progress: bool = False  # this attempt has written a checkpoint newer than the one it started from

    @property
    def others(self) -> int:
        """Restarts that spend slurm.max_requeues: attempts without progress (from the ledger); without
        a ledger (not under the hpctrain batch script), every restart that was not a preemption."""
        return max(0, self.restarts - self.preemptions) if self.stalled is None else self.stalled


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


def preempted_attempts(run_dir: Path, job_id: str, control: Path | None) -> set[int]:
    """The attempts (SLURM_RESTART_COUNT) of this job that ended in a preemption requeue: rank 0's
    `requeue` records and the batch shell's `preempted-<job>` lines."""
    out = {
        int(r["restarts"])
        for r in read_metrics(run_dir / METRICS)
        if r.get("kind") == "requeue"
        and str(r.get("job")) == job_id
        and r.get("reason") == "preemption"
        and r.get("requeue")
        and str(r.get("restarts", "")).isdigit()
    }
    try:
        text = (control / f"preempted-{job_id}").read_text() if control else ""
    except OSError:
        text = ""
    return out | {int(w) for w in text.split() if w.isdigit()}


def latest(run_dir: Path) -> str:
    """The checkpoint the run would resume from now (checkpoints/latest), NO_CHECKPOINT when none."""
    try:
        name = (run_dir / CHECKPOINTS / "latest").read_text().strip()
    except OSError:
        return NO_CHECKPOINT
    return name if name and name.isprintable() else NO_CHECKPOINT


def ledger(env: Mapping[str, str]) -> Path | None:
    """This job's progress ledger (None outside the hpctrain batch script)."""
    ctl, job = env.get("HPCTRAIN_CONTROL_DIR"), env.get("SLURM_JOB_ID")
    return Path(ctl) / PROGRESS.format(job) if ctl and job else None


def read_starts(path: Path | None) -> dict[int, str] | None:
    """attempt (SLURM_RESTART_COUNT) → the checkpoint it started from; the first line of each stands.
    None when there is no ledger."""
    try:
        text = path.read_text() if path else None
    except OSError:
        return None
    if text is None:
        return None
    starts: dict[int, str] = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) >= 2 and parts[0].isdigit():
            starts.setdefault(int(parts[0]), parts[1])
    return starts


def record_start(run_dir: Path, env: Mapping[str, str] | None = None) -> None:
    """Rank 0 at the start of an attempt: the checkpoint it starts from, in the ledger, unless the
    batch shell (or an earlier in-job restart) wrote this attempt's line already."""
    env = os.environ if env is None else env
    path = ledger(env)
    if path is None:
        return
    restart = int(env.get("SLURM_RESTART_COUNT") or 0)
    if restart in (read_starts(path) or {}):
        return
    ckpts = str(run_dir.resolve() / CHECKPOINTS)
    if not ckpts.isprintable():  # the shell reads the line by tabs and newlines
        ckpts = ""
    try:
        with open(path, "a") as f:
            f.write(f"{restart}\t{latest(run_dir)}\t{ckpts}\n")
    except OSError as e:
        log.warning(
            "cannot write the progress ledger %s (%s): every requeue of this job counts against slurm.max_requeues",
            path,
            e,
        )


def stalled(starts: dict[int, str], restarts: int, now: str, preempted: set[int]) -> int:
    """Attempts before `restarts` that ended without progress and were not preempted. An attempt
    made progress when the next attempt that says what it started from (else `now`, this attempt's
    checkpoint) starts from another checkpoint; one without a line never got to rank 0's start."""
    n = 0
    for a in range(restarts):
        if a in preempted:
            continue
        if a not in starts:
            n += 1
            continue
        after = next((starts[b] for b in range(a + 1, restarts + 1) if b in starts), now)
        n += after == starts[a]
    return n


def budget(run_dir: Path, env: Mapping[str, str] | None = None) -> Budget | None:
    """This job's budget; None outside a Slurm job."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    restarts = int(env.get("SLURM_RESTART_COUNT") or 0)
    path = ledger(env)
    starts = read_starts(path)
    spent, progress = None, False
    if starts is not None and path is not None:
        now = latest(run_dir)
        spent = stalled(starts, restarts, now, preempted_attempts(run_dir, job, path.parent))
        progress = starts.get(restarts, now) != now
    return Budget(
        job,
        restarts,
        preemptions(run_dir, job),
        int(env.get("HPCTRAIN_MAX_REQUEUES") or DEFAULT_MAX_REQUEUES),
        int(env.get("HPCTRAIN_MAX_PREEMPTIONS") or UNLIMITED),
        int(env.get("HPCTRAIN_SPARES_FREE") or 0),
        spent,
        progress,
    )


def _spent(b: Budget) -> str:
    return "without progress" if b.stalled is not None else "for time limits or failures"


def decide(kind: str, b: Budget) -> tuple[bool, str]:
    """(requeue?, why) after a stop of `kind` (preemption | time_limit | exclude | halt)."""
    if kind == "halt":
        return False, "HPCTRAIN_HALT_AT reached (a test's planned stop, not requeued)"
    if kind == "exclude":  # the batch shell runs on without the named node: on spares, else by this requeue
        if b.spares_free > 0:  # an in-job restart, not a requeue: no budget spent
            return True, f"restarting job {b.job_id} without a straggling node on a spare ({b.spares_free} free)"
        if b.max_requeues <= 0:
            return False, f"slurm.max_requeues={b.max_requeues}: requeues are off; a straggling node is left in"
        if b.progress:
            return True, (
                f"requeueing job {b.job_id} without a straggling node, or restarting it on a spare: this "
                f"attempt checkpointed, so slurm.max_requeues is not spent ({b.others}/{b.max_requeues})"
            )
        if b.others >= b.max_requeues:
            return False, (
                f"job {b.job_id} was requeued {b.others} times already {_spent(b)} "
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
    if b.max_requeues <= 0:  # the job was submitted --no-requeue: Slurm would refuse it anyway
        return False, f"slurm.max_requeues={b.max_requeues}: requeues are off for job {b.job_id}"
    if b.progress:
        return True, (
            f"requeueing job {b.job_id} after its time limit: this attempt checkpointed, so slurm.max_requeues "
            f"is not spent ({b.others}/{b.max_requeues} spent on attempts without progress)"
        )
    if b.others >= b.max_requeues:
        return False, (
            f"job {b.job_id} was requeued {b.others} times already {_spent(b)} (slurm.max_requeues={b.max_requeues})"
        )
    return True, f"requeueing job {b.job_id} after its time limit ({b.others + 1}/{b.max_requeues})"


def check_budget(b: Budget | None) -> None:
    """Refuse to start a run whose job was restarted past its caps (Slurm requeues node failures
    and preemptions on its own, uncapped). LaunchError: the CLI prints it as one line."""
    if b is None:
        return
    if b.others > b.max_requeues:
        raise LaunchError(
            f"job {b.job_id} was restarted {b.others} times {_spent(b)} "
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
    if b is None:  # SLURM_JOB_ID is set (above): never
        return False
    ok, why = decide(kind, b)
    if summary.get("rank") == 0:
        (log.warning if ok else log.error)("stopped at step %s (%s): %s", summary.get("step"), kind, why)
        if metrics is not None:
            metrics.write(
                "requeue",
                step=summary.get("step"),
                job=b.job_id,
                reason=kind,
                requeue=ok,
                why=why,
                restarts=b.restarts,
                progress=b.progress,
                spent=b.others,
            )
        write_decision(stop_file, ok, why)
    return ok

"""After a preemption/time-limit stop: rank 0 requeues the Slurm job, capped by max_requeues.

Every rank computes the same decision from the same environment (SLURM_RESTART_COUNT counts
the job's requeues, HPCTRAIN_MAX_REQUEUES comes from the profile via the batch script), so the
ranks agree without talking; only rank 0 calls `scontrol requeue`.

A node that dies is left to Slurm, not to us: the batch script asks for `--requeue` whenever
`slurm.max_requeues > 0` (`--no-requeue` otherwise), and Slurm requeues a batch job whose node
fails (NODE_FAIL). This is reliable because the job cannot end before Slurm has noticed: the
survivors' collective fails (RankFailure) and they exit, but srun keeps waiting for the tasks on
the unreachable node, so the allocation is still running when the controller declares the node
DOWN (after SlurmdTimeout) and requeues it; the new run waits until enough nodes are up again.
Requeueing from our code instead (rank 0 after a RankFailure) would be wrong twice: rank 0 may
be the one on the dead node, and a survivor cannot tell a dead node from a crashed rank (which
must fail the job, not loop). Slurm's own requeues are not capped by our count, so every start
checks the budget first (`check_budget`): past `max_requeues` the job fails with the fix.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Mapping

log = logging.getLogger("hpctrain")
DEFAULT_MAX_REQUEUES = 3


def requeues(env: Mapping[str, str]) -> tuple[int, int]:
    """(requeues so far, the cap) of this Slurm job."""
    return (int(env.get("SLURM_RESTART_COUNT") or 0),
            int(env.get("HPCTRAIN_MAX_REQUEUES") or DEFAULT_MAX_REQUEUES))


def decide(env: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """(requeue?, why) for a run that stopped on USR2."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    if not job:
        return False, "not running under Slurm"
    done, cap = requeues(env)
    if done >= cap:
        return False, f"job {job} was requeued {done} times already (slurm.max_requeues={cap})"
    return True, f"requeueing job {job} ({done + 1}/{cap})"


def after_stop(summary: Mapping, rank: int) -> bool:
    """True when the job was requeued: the caller exits now, without recording a final result."""
    if summary.get("status") != "preempted":
        return False
    ok, why = decide()
    if not ok:
        log.warning("stopped at step %s and not requeued: %s", summary.get("step"), why)
        return False
    if rank == 0:
        log.warning("stopped at step %s: %s", summary.get("step"), why)
        r = subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], capture_output=True,
                           text=True, timeout=120)
        if r.returncode != 0:
            from hpctrain.launch.submit import LaunchError

            raise LaunchError(f"scontrol requeue failed: {(r.stderr or r.stdout).strip()}; the "
                               "checkpoint is saved: resubmit the job to resume")
    return True


def check_budget(env: Mapping[str, str] | None = None) -> None:
    """Refuse to start a run whose job was requeued more than `slurm.max_requeues` times
    (LaunchError: the CLI prints it as one line)."""
    from hpctrain.launch.submit import LaunchError

    env = os.environ if env is None else env
    if not env.get("SLURM_JOB_ID"):
        return
    done, cap = requeues(env)
    if done > cap:
        raise LaunchError(
            f"job {env['SLURM_JOB_ID']} was requeued {done} times (slurm.max_requeues={cap}); giving up "
            "here: find out why its nodes fail, then resubmit to resume from the last checkpoint")

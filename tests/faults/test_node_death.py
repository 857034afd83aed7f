"""A node dies mid-run: its slurmd, slurmstepd and task are SIGKILLed at once.

The first attempt ends without hanging: the survivor's collective fails at once (or after
dist.pg_timeout_s when the dead peer's sockets stay silent), srun waits for the lost node until
the controller declares it DOWN (SlurmdTimeout), and Slurm ends the allocation as NODE_FAIL and
requeues it (the batch script has --requeue: slurm.max_requeues > 0). The job waits while the
node is down, starts when it is back, resumes from the last checkpoint and finishes.
"""

from __future__ import annotations

import dataclasses
import re
import time

import pytest

from hpctrain.config import Config
from hpctrain.launch.sbatch import sbatch_lines
from hpctrain.launch.submit import LaunchError, Request, plan_job
from hpctrain.run.requeue import budget, check_budget
from hpctrain.site.profile import load_profile
from hpctrain.train.ckpt import checkpoint as ckpt
from tests.helpers import wait_for
from tests.launch.test_slurm_jobs import digits_sets, hp, metrics, submit, wait_for_step
from tests.slurm_cluster import SLURMD_TIMEOUT

pytestmark = pytest.mark.slurm
CKPT_EVERY = 5
# The hang watchdog fires at half of it (health.hang_timeout_s): above what an epoch boundary (new loader
# workers) can take on a loaded 2-core CI machine, where 15 s (7.5 s) named a node in the resumed attempt.
PG_TIMEOUT = 60
# Survivors give up within PG_TIMEOUT (+ the same again to name the missing rank); Slurm declares the
# node DOWN within ~2.6 x SlurmdTimeout (ping every third of it; 26 s measured with 10 s); 30 s slack.
FIRST_ATTEMPT_BOUND = max(2 * PG_TIMEOUT, 3 * SLURMD_TIMEOUT) + 30


def wait_first_attempt_over(cluster, job: str, timeout: float) -> str:
    """Wait until Slurm has ended the running attempt; its state (NODE_FAIL, or PENDING once requeued)."""
    end = time.monotonic() + timeout
    st = ""
    while time.monotonic() < end:
        st = cluster.state(job)
        if st and st != "RUNNING":
            return st
        time.sleep(0.5)
    raise AssertionError(f"job {job} still {st or 'unknown'} {timeout:.0f} s after its node died: it hangs")


def wait_final(cluster, job: str, timeout: float) -> str:
    """Like cluster.wait_done, but NODE_FAIL is not final here: the record stays until the requeued
    job starts again."""
    end = time.monotonic() + timeout
    st = ""
    while time.monotonic() < end:
        st = cluster.state(job)
        if st in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY"):
            return st
        time.sleep(1)
    raise AssertionError(f"job {job} still {st or 'unknown'} after {timeout:.0f} s")


def queue_state(cluster, job: str) -> str:
    return cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()


def why_requeued(cluster, run, job: str) -> str:
    """What a failed assertion needs to say who requeued an attempt: the run's hang and fault records,
    the batch shells' own lines and the controller's lines on the job."""
    recs = [r for r in metrics(run) if r.get("kind") in ("hang", "restart", "exclude", "stop", "straggler_exclude")]
    shell = [
        ln
        for f in sorted((run / "submitit").glob(f"{job}_*_log.*"))
        for ln in f.read_text().splitlines()
        if ln.startswith("hpctrain:")
    ]
    ctld = [ln for ln in (cluster.root / "log" / "slurmctld.log").read_text().splitlines() if f"JobId={job}" in ln]
    return "\n".join(["records:", *map(str, recs), "batch shells:", *shell, "slurmctld:", *ctld[-30:]])


def test_dead_node_job_ends_then_requeues_and_resumes_from_last_checkpoint(slurm_cluster, digits_root, tmp_path):
    run = tmp_path / "nodedeath"
    job = submit(
        slurm_cluster,
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        *digits_sets(
            digits_root,
            tmp_path,
            "nodedeath",
            "train.epochs=8",
            "log.every=1",
            "train.eval_every_epochs=0",
            f"ckpt.every={CKPT_EVERY}",
            f"dist.pg_timeout_s={PG_TIMEOUT}",
        ),
    )
    try:
        wait_for_step(run, CKPT_EVERY + 2, 180)
        assert slurm_cluster.kill_node("n2") >= 3  # slurmd, slurmstepd, the task (rank 1)
        t0 = time.monotonic()
        first = wait_first_attempt_over(slurm_cluster, job, FIRST_ATTEMPT_BOUND)
        ended_after = time.monotonic() - t0
        assert first in ("NODE_FAIL", "REQUEUED", "PENDING"), first  # not FAILED: requeued by Slurm
        # What the first attempt did, read before the node is back (the job cannot start without it).
        last = metrics(run, "train")[-1]["step"]
        k = ckpt.load(ckpt.list_checkpoints(run)[0])["step"]  # newest on disk: the resume point
        assert k == max(r["step"] for r in metrics(run, "checkpoint"))
        # the job may leave RUNNING before slurmctld marks n2 DOWN: rank 0 no longer outwaits the step's
        # SIGTERM (train.collective.step_ending), and the batch shell's probe names n2 first; n2 shows
        # `mix*` (not responding, its part of the job completing) until SlurmdTimeout's pings give up on it
        wait_for(lambda: slurm_cluster.node_state("n2").startswith("down"), "n2 is not DOWN", FIRST_ATTEMPT_BOUND)
        end = time.monotonic() + 60  # the survivor's processes end (KillWait) before the job is pending again
        while queue_state(slurm_cluster, job) == "COMPLETING" and time.monotonic() < end:
            time.sleep(0.5)
        time.sleep(2)  # and it stays pending: it cannot start without n2
        assert queue_state(slurm_cluster, job) == "PENDING"
        assert not metrics(run, "end")
    finally:
        if slurm_cluster.slurmd["n2"].poll() is not None:  # never leave the session's cluster short a node
            slurm_cluster.revive_node("n2")
    assert wait_final(slurm_cluster, job, 180) == "COMPLETED"

    lost = last - k
    assert 0 < k <= last and lost <= CKPT_EVERY, (k, last)
    log0 = (run / "logs" / "rank-0.log").read_text()
    assert re.search(rf"resumed from {re.escape(str(run))}/checkpoints/step-{k:08d}(\.pt)? at step {k}\b", log0), log0[
        -2000:
    ]
    assert metrics(run, "end")[-1]["status"] == "finished"
    # (the batch output file may be truncated by the requeued run: sacct is the record of both attempts)
    rows = slurm_cluster.run("sacct", "-n", "-X", "-P", "-D", "-j", job, "-o", "State").stdout.split()
    assert rows == ["NODE_FAIL", "COMPLETED"], (rows, why_requeued(slurm_cluster, run, job))
    st = hp(slurm_cluster, "status", job)
    assert st.returncode == 0 and "COMPLETED" in st.stdout and "requeues       1" in st.stdout, st.stdout
    err = (run / "submitit" / f"{job}_0_log.err").read_text()
    # appended, not truncated: the failed attempt's lines are still above the requeued one's
    starts = re.findall(rf"hpctrain: task rank 0 of job {job} started on .* \(Slurm restart (\d+),", err)
    assert starts == ["0", "1"], err[-3000:]
    named = "rank(s) 1 stopped responding" in err
    print(
        f"node death: first attempt ended {ended_after:.1f} s after the kill (bound {FIRST_ATTEMPT_BOUND} s); "
        f"killed at step {last}, resumed at checkpoint {k}: {lost} step(s) lost; "
        f"rank 0 named rank 1: {named}"
    )


def test_requeue_flag_follows_the_profile(tmp_path):
    """Slurm requeues a job after a node failure only with --requeue: max_requeues 0 turns it off."""
    prof = load_profile("local")
    plan = plan_job(Config(), prof, Request(nodes=2, gpus_per_node=1))
    assert "#SBATCH --requeue" in sbatch_lines(plan)
    off = dataclasses.replace(prof, slurm=dataclasses.replace(prof.slurm, max_requeues=0))
    assert "#SBATCH --no-requeue" in sbatch_lines(dataclasses.replace(plan, profile=off))
    run = tmp_path  # no preemption records: every restart was a node failure (or time limit)
    check_budget(budget(run, {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "3", "HPCTRAIN_MAX_REQUEUES": "3"}))
    with pytest.raises(LaunchError, match="restarted 4 times for time limits or failures .slurm.max_requeues=3."):
        check_budget(budget(run, {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "4", "HPCTRAIN_MAX_REQUEUES": "3"}))

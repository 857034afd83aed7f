"""A rank's process dies and its node stays up (an OOM kill, a segfault, a CUDA error that takes the
context): the batch shell restarts the step in the same allocation, on the same nodes, from the last
checkpoint (launch/shell/restarts.sh), and the run ends as if nothing had happened.

On the Slurm test cluster: 2 nodes × 2 tasks, no spares. srun --kill-on-bad-exit ends the step when
the rank is SIGKILLed; every node answers its probe, so no node is named; before restarts came in,
the job ended FAILED here (the test that said so, test_killed_rank_fails_the_job_quickly, is this one).
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
import torch

from hpctrain.train.ckpt import checkpoint as ckpt
from tests.launch.jobs import (
    JOB_SETS,
    JOB_STEPS,
    digits_sets,
    hp,
    job_report,
    metrics,
    sacct_states,
    submit,
    task_pid,
    uninterrupted,
    wait_for_step,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
SETS = (*JOB_SETS, "ckpt.every=5")
STEPS = JOB_STEPS


@pytest.fixture(scope="module")
def reference(digits_root, tmp_path_factory) -> dict:
    """The uninterrupted 4-rank run's final weights (local gloo ranks, same config, threads pinned)."""
    return uninterrupted(4, digits_root, tmp_path_factory)


def test_a_killed_rank_restarts_in_the_allocation_and_ends_bit_exact(slurm_cluster, digits_root, tmp_path, reference):
    run = tmp_path / "kill"
    # rank 0 waits 0.3 s per step for data (a sleep: the arithmetic is unchanged), so that the kill
    # lands mid-run however fast the machine is
    job = submit(
        slurm_cluster,
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        *digits_sets(digits_root, tmp_path, "kill", *SETS),
        env={"HPCTRAIN_TEST_DELAY": "0:0.3:data"},
    )
    wait_for_step(run, 7, 180)
    pid = task_pid(job, 3)  # on the second node: not the batch host
    assert pid
    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    assert slurm_cluster.wait_done(job, 600) == "COMPLETED", job_report(slurm_cluster, job, run)
    assert sacct_states(slurm_cluster, job) == ["COMPLETED"]  # one allocation: never requeued
    (restart,) = metrics(run, "restart")
    assert restart["nodes"] == [] and restart["attempt"] == 1 and str(restart["job"]) == job, restart
    assert restart["why"].startswith("exit "), restart
    final = ckpt.load(ckpt.list_checkpoints(run)[0])
    assert final["step"] == STEPS and metrics(run, "end")[-1]["status"] == "finished"
    assert all(torch.equal(final["model"][k], v) for k, v in reference.items())
    resumed = [int(s) for s in re.findall(r"resumed from \S+ at step (\d+)", (run / "logs" / "rank-0.log").read_text())]
    assert len(resumed) == 1 and resumed[0] % 5 == 0 and resumed[0] >= 5, resumed
    batch = (run / "submitit" / f"{job}_0_log.out").read_text() + (run / "submitit" / f"{job}_0_log.err").read_text()
    assert "with no faulty node" in batch and "Restart 1/3 in this job on the same nodes" in batch, batch[-3000:]
    st = hp(slurm_cluster, "status", job).stdout
    assert "COMPLETED" in st and re.search(r"requeues +0\n", st), st
    assert re.search(rf"restarts +1 in the job on the same nodes \(last: attempt 1 of job {job}: exit ", st), st
    (started,) = [r for r in metrics(run, "startup") if r["attempt"] == 1 and str(r["job"]) == job]
    table, again = phase_table(killed_at, restart, started["at"])
    (first,) = [r for r in metrics(run, "startup") if r["attempt"] == 0]
    fresh = first["at"]["first_step"] - first["at"]["launched"]  # this job's own cold start, under today's load
    print(
        f"killed rank: resumed at step {resumed[0]} of {STEPS}; the first attempt's start-up took {fresh:.1f} s; "
        f"the restart's phases:\n{table}"
    )
    # docs/faults.md, "A restart that costs seconds": 31-69 s before (KillWait's SIGKILL of rank 0, among
    # others), 7-8 s after on an idle machine. Most of it is four new processes' imports and builds on 2
    # cores, and under load the survivors may take until KillWait to leave their collectives (5.2 s seen):
    # the 15 s bound holds where this job's own cold start says the machine is quiet
    if fresh <= QUIET_START_S:  # a quiet machine: the bounds of docs/faults.md
        assert restart_launched(restart, started["at"]) - killed_at <= LAUNCH_S, table
        assert again <= RESTART_S, f"rank death → training again took {again:.1f} s (> {RESTART_S} s)\n{table}"
    else:  # a loaded one (CI's other workers): no worse than two cold starts (before: 31-69 s beside one)
        assert again <= 2 * fresh, f"rank death → training again took {again:.1f} s (> 2 × {fresh:.1f} s)\n{table}"


RESTART_S = 15.0  # rank death → the first step trained again, on the 2-core test cluster (issue 59)
LAUNCH_S = 3.0  # rank death → the next step launched: detection, the probe, the decision (1.3 s measured)
QUIET_START_S = 10.0  # a cold start-up this short: the machine is quiet (7-8 s measured alone, 15-20 s loaded)


def restart_launched(restart: dict, at: dict[str, float]) -> float:
    """When the batch shell launched the restarted step (rank 0's `launched` mark, else the decision)."""
    return at.get("launched", restart["decided_at"])


def phase_table(killed_at: float, restart: dict, at: dict[str, float]) -> tuple[str, float]:
    """The restart's phases, each from the end of the one before: the batch shell's (the step's end,
    its decision: the `restart` record) and rank 0's start-up (the `startup` record's marks,
    run/startup.py). Returns the table and the seconds from the kill to the first step trained."""
    ends = [("step ended (srun returned)", restart["step_ended_at"]), ("restart decided", restart["decided_at"])]
    ends += [(phase, t) for phase, t in at.items()]
    rows, prev = [f"  {'phase':<28}{'took':>8}{'since kill':>12}"], killed_at
    for name, t in ends:
        rows.append(f"  {name:<28}{t - prev:>7.2f}s{t - killed_at:>11.2f}s")
        prev = t
    return "\n".join(rows), at["first_step"] - killed_at


def test_the_same_crash_at_the_same_step_twice_ends_the_job_in_one_line(slurm_cluster, digits_root, tmp_path):
    """A deterministic bug (rank 1 raises at step 12 in every attempt): one restart from the step-10
    checkpoint, the same error at the same step again, and the job ends FAILED with that error in one
    line instead of burning its allocation."""
    run = tmp_path / "loop"
    job = submit(
        slurm_cluster,
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        *digits_sets(digits_root, tmp_path, "loop", *SETS),
        env={"HPCTRAIN_TEST_CRASH": "1:12"},
    )
    assert slurm_cluster.wait_done(job, 600) == "FAILED", job_report(slurm_cluster, job, run)
    assert sacct_states(slurm_cluster, job) == ["FAILED"]  # never requeued; the allocation is released
    assert slurm_cluster.run("squeue", "-h", "-j", job, check=False).stdout.strip() == ""
    (restart,) = metrics(run, "restart")
    assert "in step 12: RuntimeError: injected crash at step 12" in restart["why"], restart
    batch = (run / "submitit" / f"{job}_0_log.out").read_text()
    said = [line for line in batch.splitlines() if "A bug, not a fault" in line]
    assert len(said) == 1 and "failed twice in a row the same way" in said[0], batch[-3000:]
    assert "rank 1 on " in said[0] and "in step 12: RuntimeError: injected crash at step 12" in said[0], said
    starts = re.findall(
        rf"task rank 1 of job {job} started .*attempt (\d+) in the allocation",
        (run / "submitit" / f"{job}_1_log.err").read_text(),
    )
    assert starts == ["0", "1"], starts

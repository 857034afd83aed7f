"""A fault campaign: one job, every fault this project restarts itself from, one after another.

On a Slurm test cluster of its own (Debian's Slurm; 4 nodes in the spares partition: a job of 2
training nodes and 1 spare still fits once it is requeued without a faulty node), a 2-node × 2-task
digits job with one spare lives through, in sequence:

1. a rank's Python SIGKILLed (its node stays up): restart in the allocation, on the same nodes;
2. a rank exiting with a CUDA hardware error (an ECC error, as after an Xid) on a node whose GPU then
   drops out of the probe's fake `nvidia-smi -L`: the node is named, the spare takes its place;
3. a slurmctld restart while the job trains: nothing happens to the job;
4. a time-limit USR2 to the batch shell: checkpoint, requeue without the faulty node;
5. a node that dies (slurmd and every process on it SIGKILLed): the new allocation's spare takes
   its place.

The job ends COMPLETED with the weights of an uninterrupted 4-rank run, bit for bit; every fault the
job saw is a record with its cause; every restart resumed from the newest checkpoint on disk when
the fault struck (none lost).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
import torch

from hpctrain.train.ckpt import checkpoint as ckpt
from hpctrain.train.health.faults import GPU_FAULT_ENV
from tests.helpers import wait_for
from tests.launch.jobs import (
    JOB_SETS,
    JOB_STEPS,
    batch_host,
    digits_sets,
    hp,
    job_report,
    metrics,
    rank_hosts,
    sacct_states,
    submit,
    task_pid,
    uninterrupted,
    wait_for_step,
)
from tests.launch.test_spares import gpu_probe_env
from tests.slurm_cluster import SPARE_PARTITION, SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
SETS = (*JOB_SETS, "ckpt.every=5")
# rank 0 waits 0.5 s per step for data (a sleep: the arithmetic is unchanged), so that each fault
# lands mid-run however fast the machine is
SLOW_DATA = {"HPCTRAIN_TEST_DELAY": "0:0.5:data"}


@pytest.fixture(scope="module")
def campaign_cluster(tmp_path_factory, site_users):
    c = SlurmCluster(tmp_path_factory.mktemp("slurm-campaign"), spare_nodes=2, users=site_users).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def reference(digits_root, tmp_path_factory) -> dict:
    """The uninterrupted 4-rank run's final weights (local gloo ranks, same config, threads pinned)."""
    return uninterrupted(4, digits_root, tmp_path_factory)


def restarted(cluster, job: str, run, n: int) -> None:
    """Until the batch shell has recorded its `n`-th restart in this allocation."""
    wait_for(lambda: len(metrics(run, "restart")) >= n, f"no restart {n}", 300, lambda: job_report(cluster, job, run))


def newest_checkpoint(run) -> int:
    return max((ckpt.step_of(p) for p in ckpt.list_checkpoints(run)), default=0)


def test_a_fault_campaign_with_one_spare_ends_completed_and_bit_exact(
    campaign_cluster, digits_root, tmp_path, reference
):
    c = campaign_cluster
    run, lost = tmp_path / "campaign", tmp_path / "lost-gpus"
    lost.write_text("")
    env = {**SLOW_DATA, **gpu_probe_env(lost), "HPCTRAIN_PROBE_GPUS": "2", GPU_FAULT_ENV: str(lost)}
    started = time.time()
    job = submit(
        c,
        "--partition",
        SPARE_PARTITION,
        "--nodes",
        "2",
        "--spare-nodes",
        "1",
        "--gpus-per-node",
        "2",
        *digits_sets(digits_root, tmp_path, "campaign", *SETS),
        env=env,
    )
    on_disk: list[int] = []  # the newest checkpoint when each fault that restarts struck
    dead = None
    try:
        # 1. a rank's Python dies, its node stays up
        wait_for_step(run, 7, 240)
        first = batch_host(c, job)
        rank = next(r for r, (_, h) in sorted(rank_hosts(run).items()) if h != first)
        pid = task_pid(job, rank)
        assert pid, job_report(c, job, run)
        on_disk.append(newest_checkpoint(run))
        os.kill(pid, signal.SIGKILL)
        restarted(c, job, run, 1)

        # 2. a CUDA hardware error on a node whose GPU then fails its probe
        wait_for_step(run, 14, 300)
        faulty = next(h for r, (_, h) in sorted(rank_hosts(run).items()) if h != first)
        on_disk.append(newest_checkpoint(run))
        lost.write_text(f"{faulty}\n")
        restarted(c, job, run, 2)

        # 3. the controller restarts while the job trains
        wait_for_step(run, 20, 300)
        assert faulty not in {h for _, h in rank_hosts(run).values()}, job_report(c, job, run)
        c.restart_slurmctld(down_s=5)
        assert c.state(job) == "RUNNING", job_report(c, job, run)

        # 4. a time-limit stop: checkpoint, requeue without the faulty node
        wait_for_step(run, 24, 300)
        on_disk.append(newest_checkpoint(run))
        c.run("scancel", "--signal=USR2", "--batch", job)
        (stop,) = wait_for(lambda: metrics(run, "stop"), "no stop record", 300, lambda: job_report(c, job, run))
        wait_for(
            lambda: (run / "attempts" / f"env-{job}-1-0.json").is_file(),
            "the requeued job did not start",
            300,
            lambda: job_report(c, job, run),
        )

        # 5. in the new allocation, a training node that is not the batch host dies
        wait_for_step(run, stop["step"] + 5, 300)
        second = batch_host(c, job)
        dead = next(h for r, (_, h) in sorted(rank_hosts(run).items()) if h != second)
        on_disk.append(newest_checkpoint(run))
        assert c.kill_node(dead) >= 3  # slurmd, slurmstepd, the task(s)
        assert c.wait_done(job, 600) == "COMPLETED", job_report(c, job, run)
    finally:
        if dead and c.slurmd[dead].poll() is not None:
            c.revive_node(dead)
    took = time.time() - started

    # what Slurm saw: the faulty node excluded at the requeue
    states = sacct_states(c, job)
    show = c.run("scontrol", "show", "job", "-o", job).stdout
    assert re.search(rf"\bExcNodeList={faulty}\b", show), show

    # every fault a record with its cause
    r1, r2, r3 = metrics(run, "restart")
    assert r1["nodes"] == [] and r1["why"].startswith("exit "), r1  # the killed rank: the same nodes
    assert r2["nodes"] == [faulty] and "uncorrectable ECC error" in r2["why"], r2  # the GPU: the spare
    assert r3["nodes"] == [dead] and str(r3["job"]) == job, r3  # the dead node: the second spare
    assert (r1["slurm_restart"], r2["slurm_restart"], r3["slurm_restart"]) == (0, 0, 1), (r1, r2, r3)
    (exclude,) = metrics(run, "exclude")  # the requeue, with the node's evidence
    assert exclude["nodes"] == [faulty] and "uncorrectable ECC error" in exclude["why"], exclude
    assert metrics(run, "stop") == [stop] and stop["stop_kind"] == "time_limit", stop

    # no checkpoint lost: each attempt resumed from the newest checkpoint on disk when its fault struck
    resumed = [int(s) for s in re.findall(r"resumed from \S+ at step (\d+)", (run / "logs" / "rank-0.log").read_text())]
    assert len(resumed) == 4 and all(r >= d for r, d in zip(resumed, on_disk, strict=True)), (resumed, on_disk)
    assert resumed[2] == stop["step"], (resumed, stop)

    # the end: the uninterrupted run's weights
    final = ckpt.load(ckpt.list_checkpoints(run)[0])
    assert final["step"] == JOB_STEPS and metrics(run, "end")[-1]["status"] == "finished"
    assert all(torch.equal(final["model"][k], v) for k, v in reference.items())
    # one requeue; the second allocation shrank when its node died (a RESIZING row; no NODE_FAIL: the
    # job is --no-kill); each step ran where it should
    assert states == ["REQUEUED", "RESIZING", "COMPLETED"], states
    envs = {p.name: json.loads(p.read_text()) for p in (run / "attempts").glob("env-*.json")}
    assert sorted(envs) == [f"env-{job}-{r}-{a}.json" for r, a in ((0, 0), (0, 1), (0, 2), (1, 0), (1, 1))], envs
    for name in (f"env-{job}-0-2.json", f"env-{job}-1-0.json", f"env-{job}-1-1.json"):
        assert faulty not in envs[name]["env"]["SLURM_STEP_NODELIST"], (name, envs[name]["env"])
    assert dead not in envs[f"env-{job}-1-1.json"]["env"]["SLURM_STEP_NODELIST"]
    st = hp(c, "status", job).stdout
    assert "COMPLETED" in st and re.search(r"requeues +1 \(0 after preemption, 1 after a time limit", st), st
    assert re.search(rf"restarts +3 in the job on spare nodes \(last: attempt 1 of job {job} without {dead}", st), st
    assert re.search(rf"excluded +{faulty} \(rank \d failed: RuntimeError: CUDA error: uncorrectable ECC", st), st
    assert re.search(rf"; {dead} \(left the job's allocation \(Slurm: node failure\)\)", st), st
    # where the campaign's time went (run/goodput.py): every process in the ledger, the restarts' downtime
    # and lost progress among its categories, and the categories sum to the wall time
    led = json.loads(hp(c, "goodput", job, "--json").stdout)
    print(hp(c, "goodput", job).stdout)
    cats = {k: v["seconds"] for k, v in led["categories"].items()}
    assert abs(led["sum_s"] - led["wall_s"]) <= 0.01 * led["wall_s"], (led["sum_s"], led["wall_s"], cats)
    assert [(a["slurm_restart"], a["attempt"]) for a in led["attempts"]] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    assert cats["restart"] > 0 and cats["lost"] > 0 and cats["queue"] >= 0 and cats["productive"] > 0, cats
    print(
        f"fault campaign: job {job} COMPLETED {took:.0f} s after submission through a killed rank, a GPU "
        f"fault on {faulty}, a slurmctld restart, a time-limit requeue and the death of {dead}; resumed at "
        f"steps {resumed} (newest checkpoint at each fault: {on_disk})"
    )

"""`hpctrain plan` that knows the queue: its figures against what the test cluster's sacct holds.

One history, made once on a partition of its own (created at run time, so no other test's job is
in it): jobs of 1 and 2 nodes queued behind each other, one node failure, one preemption. The
medians are computed here by hand from sacct's own rows and must be the ones the plan prints.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from datetime import datetime

import pytest

from hpctrain.config import load
from hpctrain.memory import checkpoint_bytes
from hpctrain.plan.recommend import dur
from hpctrain.site.profile import load_profile
from tests.launch.jobs import hp, sbatch_wrap, wait_running
from tests.slurm_cluster import NODES, URGENT

VIT_B = "configs/vit_b16_imagenet.yaml"
ACCOUNT, LIMIT_NODE_MIN = "planacct", 1_000_000


def _make_history(cluster, part: str) -> None:
    """~30 s: a 2-node job loses n2 (NODE_FAIL), a 1-node job is preempted by URGENT (GraceTime 0 on
    this partition), then 5 jobs of 1 node and 5 of 2 nodes, all at once, queue behind each other."""
    a = sbatch_wrap(cluster, part, 2, "sleep 600", "--requeue")
    wait_running(cluster, a)
    time.sleep(1)
    cluster.fail_node("n2", "plan test")
    cluster.run("scancel", a)  # requeued, held back by BeginTime: gone
    b = sbatch_wrap(cluster, part, 1, "sleep 600", "--requeue")
    wait_running(cluster, b)
    time.sleep(1)
    urgent = sbatch_wrap(cluster, URGENT, 2, "true")
    cluster.wait_done(urgent, 60)
    cluster.run("scancel", b)
    jobs = [sbatch_wrap(cluster, part, n, "sleep 1") for n in (1, 2) * 5]
    for j in jobs:
        cluster.wait_done(j, 120)


def _sacct_rows(cluster, part: str) -> list[dict[str, str]]:
    fields = ["JobIDRaw", "State", "NNodes", "Eligible", "Start", "End", "ElapsedRaw"]
    out = cluster.run(
        "sacct",
        "-X",
        "-D",
        "-a",
        "-n",
        "-P",
        "-r",
        part,
        "-S",
        "2020-01-01",
        "-E",
        "now",
        "-o",
        ",".join(fields),
        env={"SLURM_TIME_FORMAT": "standard"},
    ).stdout
    return [dict(zip(fields, ln.split("|"))) for ln in out.splitlines() if ln.strip()]


def _seconds(a: str, b: str) -> float:
    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()


@pytest.fixture(scope="module")
def history(slurm_cluster):
    """The partition with its history, and sacct's rows of it."""
    part = f"plan{random.randrange(10**6)}"
    slurm_cluster.run(
        "scontrol",
        "create",
        f"PartitionName={part}",
        f"Nodes={','.join(NODES)}",
        "MaxTime=INFINITE",
        "State=UP",
        "PriorityTier=1",
        "PreemptMode=REQUEUE",
        "GraceTime=0",
    )
    run = slurm_cluster.run
    run(
        "sacctmgr",
        "-i",
        "add",
        "account",
        ACCOUNT,
        "Description=t",
        "Organization=t",
        f"GrpTRESMins=node={LIMIT_NODE_MIN}",
        check=False,
    )
    run("sacctmgr", "-i", "add", "user", "root", f"account={ACCOUNT}", check=False)
    try:
        _make_history(slurm_cluster, part)
        yield part, _sacct_rows(slurm_cluster, part)
    finally:
        run("scontrol", "delete", f"PartitionName={part}", check=False)
        run("sacctmgr", "-i", "delete", "user", "root", f"account={ACCOUNT}", check=False)


@pytest.mark.slurm
@pytest.mark.slow  # ~45 s of jobs on the test cluster (its history), ~75 s with its start on a loaded machine
def test_plan_figures_are_sacct_s_medians(slurm_cluster, history):
    part, rows = history
    states = [r["State"].split()[0] for r in rows]
    assert states.count("PREEMPTED") == 1 and states.count("NODE_FAIL") == 1, rows
    # by hand: Start − Eligible of every started allocation, per size class (1 node; 2-3 nodes)
    # (a job cancelled while pending has a Start, = its End, but ran for 0 s: not a wait that ended)
    ran = [
        r
        for r in rows
        if r["Start"] not in ("Unknown", "None") and not (r["State"].startswith("CANCELLED") and r["ElapsedRaw"] == "0")
    ]
    waits = {n: [_seconds(r["Eligible"], r["Start"]) for r in ran if r["NNodes"] == str(n)] for n in (1, 2)}
    assert min(waits[1] + waits[2]) >= 0, rows
    assert len(waits[1]) >= 5 and len(waits[2]) >= 5 and max(waits[1] + waits[2]) > 0, waits  # some queued
    node_h = sum(int(r["NNodes"]) * int(r["ElapsedRaw"]) for r in rows) / 3600
    # the profile named: a plan without a site profile recommends nothing
    plan = (
        "plan",
        "--config",
        VIT_B,
        "--cluster",
        "local",
        "--nodes",
        "1,2,4",
        "--partition",
        part,
        "--account",
        ACCOUNT,
    )
    r = hp(slurm_cluster, *plan, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    opts = {o["nodes"]: o for o in out["options"]}
    cfg, profile = load(VIT_B), load_profile("local")
    for n in (1, 2):
        o = opts[n]
        assert o["queue_s"] == statistics.median(waits[n]) and o["queue_jobs"] == len(waits[n]), o
        label = {1: "1 node", 2: "2-3 nodes"}[n]  # the size classes: powers of two
        assert o["queue_source"].startswith(f"median of {len(waits[n])} jobs of {label} that started"), o
        # interruptions: 2 in node_h node-hours; a job of n nodes: n times as often
        job_mtbf_s = node_h / 2 * 3600 / n
        assert o["interruptions"] == pytest.approx(o["train_s"] / job_mtbf_s, rel=1e-3)
        step_s = next(row["step_s"] for row in out["rows"] if row["nodes"] == n)
        tau, save = cfg.ckpt.every * step_s, checkpoint_bytes(cfg) / 1e9 / profile.slurm.ckpt_write_gbps
        # 1 requeue (the preempted job's was cancelled): fewer than 5, so a requeue waits as a new job does
        loss = o["train_s"] / tau * save + o["interruptions"] * (tau / 2 + o["queue_s"])
        assert o["interruption_loss_s"] == pytest.approx(loss, rel=1e-3)
        assert o["result_s"] == pytest.approx(o["queue_s"] + o["train_s"] + loss, rel=1e-6)
        assert "1 preemptions, 1 node failures in" in o["interruption_source"]
        # allocation: the account's GrpTRESMins in node-minutes, less sshare's used and running minutes
        alloc = out["allocation"]
        left = LIMIT_NODE_MIN - alloc["used_mins"].get("node", 0) - alloc["running_mins"].get("node", 0)
        assert alloc["grp_tres_mins"] == {"node": LIMIT_NODE_MIN}
        assert o["allocation_share"] == pytest.approx(n * o["train_s"] / 60 / left, rel=1e-6)
    assert opts[4]["excluded"] == f"never: partition {part} has only 2 nodes (sinfo)" and opts[4]["result_s"] is None
    assert out["now"]["total"] == 2
    best = min((opts[1], opts[2]), key=lambda o: o["result_s"])
    assert out["recommend"]["nodes"] == best["nodes"] and "done" in out["recommend"]["reason"]
    # the printed table says the same, and where each figure came from
    r = hp(slurm_cluster, *plan)
    assert r.returncode == 0, r.stderr
    assert (
        f"queue at 1 node(s): median of {len(waits[1])} jobs of 1 node that started (sacct, partition {part}"
        in r.stdout
    ), r.stdout
    assert f"queue at 4 node(s): never: partition {part} has only 2 nodes" in r.stdout
    assert f"recommend: {best['nodes']} nodes: done" in r.stdout
    # submit prints the one line for the request it submits (a dry run too): GPU jobs with the training
    r = hp(
        slurm_cluster,
        "submit",
        "--config",
        VIT_B,
        "--dry-run",
        "--partition",
        part,
        "--nodes",
        "2",
        "--cluster-set",
        "slurm.request_gpus=true",
    )
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stderr.splitlines() if "time to result" in ln)
    assert (
        f"time to result: 2 node(s) on partition {part}: queue {statistics.median(waits[2]):.0f} s "
        f"(median of {len(waits[2])} jobs of 2-3 nodes" in line
    ), line
    assert f"+ train {dur(opts[2]['train_s'])} + interruptions" in line, line
    r = hp(
        slurm_cluster, "submit", "--config", "configs/digits_vit.yaml", "--dry-run", "--partition", part, "--nodes", "1"
    )  # a CPU job: the queue alone
    assert (
        f"hpctrain: queue: 1 node(s) (1 node) on partition {part}: {statistics.median(waits[1]):.0f} s" in r.stderr
    ), r.stderr

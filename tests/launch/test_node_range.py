"""Node ranges (docs/launch.md, "Node ranges and fewer nodes"), on the session's Slurm test cluster.

`--nodes 2-3` on the spares partition (n1, n2, n3): with one of its nodes held by another job the
range starts on the two free ones and ends; with all three free it gets three, and when one of them
dies with no spare free the job goes on in the same allocation on the other two (no requeue, never
pending again), at the same global batch: every optimizer step trains on the same samples with the
same augmentation seeds as a fixed 3-node run (`log.sample_hashes`), and its final top-1 is the
fixed run's within a point.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.config import Config
from hpctrain.launch.sbatch import sbatch_lines
from hpctrain.launch.submit import Request, plan_job
from hpctrain.run.layout import SAMPLE_HASHES
from hpctrain.run.sample_hashes import read_last
from hpctrain.site.profile import load_profile
from tests.helpers import wait_for
from tests.launch.jobs import (
    batch_host,
    digits_sets,
    hp,
    metrics,
    rank_hosts,
    sacct_states,
    sbatch_wrap,
    submit,
    wait_for_step,
    wait_running,
)
from tests.slurm_cluster import SPARE_PARTITION

# 4 epochs of digits (88 steps at the global batch of 64: 10⅔ per rank over 6 ranks, 16 over 4), a
# record per step, a checkpoint every 10 steps, the evaluation at the end, each step's sample hash
SETS = (
    "train.epochs=4",
    "log.every=1",
    "train.eval_every_epochs=4",
    "ckpt.every=10",
    "log.sample_hashes=true",
)
STEPS = 88


def test_a_range_renders_min_max_nodes_no_kill_and_cpus_per_node():
    """`--nodes 12-16` asks Slurm for 12 to 16 nodes, with --no-kill (a lost node leaves the job), and
    each node's CPUs as --mincpus, not --ntasks-per-node (Slurm 22.05 would cap the range at MIN × it)."""
    profile = load_profile("example-ib")
    cfg = Config()
    plan = plan_job(cfg, profile, Request(nodes=16, min_nodes=12, gpus_per_node=8), standalone=True)
    lines = sbatch_lines(plan)
    assert "#SBATCH --nodes=12-16" in lines and "#SBATCH --no-kill" in lines, lines
    assert f"#SBATCH --mincpus={8 * plan.cpus_per_task}" in lines and plan.cpus_per_task > 0, lines
    assert not [line for line in lines if line.startswith("#SBATCH --ntasks")], lines
    fixed = sbatch_lines(plan_job(cfg, profile, Request(nodes=16, gpus_per_node=8), standalone=True))
    assert "#SBATCH --nodes=16" in fixed and "#SBATCH --no-kill" not in fixed, fixed
    assert "#SBATCH --ntasks-per-node=8" in fixed and not [line for line in fixed if "--mincpus" in line], fixed


def hashes(run: Path) -> dict[int, str]:
    """step → the sample hash the run kept (its last line: a resumed attempt writes steps again)."""
    return {step: r["hash"] for step, r in read_last(run / SAMPLE_HASHES).items()}


def env_sizes(run: Path) -> list[tuple[int, int]]:
    """(nodes, world size) of every attempt, oldest first."""
    out = []
    for f in sorted((run / "attempts").glob("env-*.json"), key=lambda p: p.stat().st_mtime):
        r = json.loads(f.read_text())["resolved"]
        out.append((r["nodes"], r["world_size"]))
    return out


@pytest.mark.slurm
def test_a_node_range_starts_at_once_on_the_nodes_that_are_free(slurm_cluster, digits_root, tmp_path):
    c = slurm_cluster
    blocker = sbatch_wrap(c, SPARE_PARTITION, 1, "sleep 600", "-w", "n3")
    try:
        wait_running(c, blocker)
        run = tmp_path / "range"
        job = submit(
            c,
            *("--partition", SPARE_PARTITION, "--nodes", "2-3", "--gpus-per-node", "2"),
            *digits_sets(digits_root, tmp_path, "range", "train.max_steps=4", "log.every=1"),
        )
        assert c.wait_done(job, 300) == "COMPLETED"
        # it did not wait for a third node: n3 was held all along
        assert c.state(blocker) == "RUNNING"
        assert env_sizes(run) == [(2, 4)]
        assert {h for _, h in rank_hosts(run).values()} == {"n1", "n2"}
        assert [r["step"] for r in metrics(run, "train")][-1] == 4
    finally:
        c.run("scancel", blocker, check=False)


@pytest.mark.slurm
def test_a_lost_node_with_no_spare_goes_on_with_fewer_nodes_on_the_same_samples(slurm_cluster, digits_root, tmp_path):
    c = slurm_cluster
    args = ("--partition", SPARE_PARTITION, "--gpus-per-node", "2")
    fixed = submit(c, *args, "--nodes", "3", *digits_sets(digits_root, tmp_path, "fixed", *SETS))
    assert c.wait_done(fixed, 900) == "COMPLETED"

    run = tmp_path / "elastic"
    job = submit(c, *args, "--nodes", "2-3", *digits_sets(digits_root, tmp_path, "elastic", *SETS))
    dead = None
    try:
        wait_for_step(run, 24, 300)  # after the checkpoint at step 20
        first = batch_host(c, job)
        assert len({h for _, h in rank_hosts(run).values()}) == 3
        dead = next(h for _, (_, h) in sorted(rank_hosts(run).items()) if h != first)
        assert c.kill_node(dead) >= 3  # slurmd, slurmstepd, the tasks
        assert c.wait_done(job, 900) == "COMPLETED"
    finally:
        if dead and c.slurmd[dead].poll() is not None:
            c.revive_node(dead)

    # the same allocation: never requeued, never pending again (sacct's RESIZING row: the node that left)
    assert sacct_states(c, job) == ["RESIZING", "COMPLETED"]
    assert sorted(p.name for p in (run / "attempts").glob("env-*.json")) == [
        f"env-{job}-0-0.json",
        f"env-{job}-0-1.json",
    ]
    assert env_sizes(run) == [(3, 6), (2, 4)]
    (restart,) = metrics(run, "restart")
    assert restart["fewer_nodes"] and restart["nodes"] == [dead], restart
    (resize,) = metrics(run, "resize")
    assert (resize["nodes_before"], resize["nodes"]) == (3, 2), resize
    assert (resize["world_size_before"], resize["world_size"]) == (6, 4), resize
    assert resize["step"] == 20 and dead in resize["why"], resize

    # the same training: every step's samples and seeds, and the accuracy within a point
    want, got = hashes(tmp_path / "fixed"), hashes(run)
    assert sorted(want) == list(range(1, STEPS + 1)) and got == want
    top1 = {name: metrics(tmp_path / name, "eval")[-1]["top1"] for name in ("fixed", "elastic")}
    print(f"final top-1: fixed 3 nodes {top1['fixed']:.2f}, 3 -> 2 nodes {top1['elastic']:.2f}")
    assert abs(top1["fixed"] - top1["elastic"]) <= 1.0, top1

    st = hp(c, "status", str(run))
    assert "resized" in st.stdout and "3 → 2 nodes (world 6 → 4" in st.stdout, st.stdout
    gp = hp(c, "goodput", str(run))
    assert "resized      at step 20: 3 → 2 nodes (world 6 → 4" in gp.stdout, gp.stdout


@pytest.mark.slurm
def test_a_requeued_range_asks_for_its_range_again_and_grows_back(slurm_cluster):
    """What a requeue after fewer nodes relies on (docs/launch.md): Slurm keeps a requeued job's
    MIN-MAX, so the next allocation takes what is free up to MAX; measured here, not documented."""
    c = slurm_cluster
    blocker = sbatch_wrap(c, SPARE_PARTITION, 1, "sleep 600", "-w", "n3")
    job = ""
    try:
        wait_running(c, blocker)
        job = sbatch_wrap(c, SPARE_PARTITION, 1, "sleep 600", "--nodes=2-3", "--no-kill", "--requeue")
        wait_running(c, job)
        nodes = c.run("squeue", "-h", "-j", job, "-o", "%D").stdout.strip()
        assert nodes == "2"
        c.run("scancel", blocker)
        c.run("scontrol", "requeue", job)

        def grown():
            out = c.run("squeue", "-h", "-j", job, "-o", "%T %D").stdout.split()
            return out == ["RUNNING", "3"]

        wait_for(grown, f"the requeued job {job} did not start on 3 nodes", 120)
        assert sacct_states(c, job)[0] == "REQUEUED"
    finally:
        c.run("scancel", blocker, *([job] if job else []), check=False)

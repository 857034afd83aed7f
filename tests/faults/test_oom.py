"""A rank that outgrows the job's memory is killed by the kernel's cgroup OOM handler, and `hpctrain
status` says so: OUT_OF_MEMORY, the step, and the rank, node and peak memory Slurm recorded.

On a test cluster with cgroups as sites run them (SlurmCluster(cgroups=True): task/cgroup with
ConstrainRAMSpace, proctrack/cgroup, jobacct_gather/cgroup): 1 node × 2 ranks, --mem 2000M;
HPCTRAIN_TEST_OOM makes rank 1 fill memory in step 3 of every attempt. srun --kill-on-bad-exit ends
the step; no node is named, so the batch shell restarts it once on the same nodes (restarts.sh,
HPCTRAIN_MAX_RESTARTS=1 here), the same kill follows, and the job ends FAILED: every training step
of it OUT_OF_MEMORY in sacct, while the job's own row says only FAILED. One node: a step that srun
ends after a task on another node was killed carried only the first node's memory figures (measured,
22.05.8: MaxRSS named rank 0 on n1, the killed rank 1 on n2 was missing; docs/observability.md).

The parsing test reads rows captured from this cluster (Slurm 22.05.8), not invented ones.
"""

from __future__ import annotations

import json
import os

import pytest

from hpctrain.train.health.faults import OOM_ENV, exhaust_memory, injected_oom
from hpctrain.watch.steps import FIELDS, OOM, oom_steps, parse_steps, rss_bytes
from tests.launch.jobs import JOB_SETS, digits_sets, hp, job_report, metrics, sacct_states, submit
from tests.slurm_cluster import SlurmCluster, cgroups_missing, missing, slurm24_root

MEM = "2000M"  # the node's: 2 ranks train in well under it; the filling rank passes it within seconds
MEM_BYTES = 2000 << 20

# `sacct -n -P -D -j <job> -o JobID,State,ExitCode,MaxRSS,MaxRSSTask,MaxRSSNode` on the cgroup test
# cluster (22.05.8) after the job of the test below: two training steps OUT_OF_MEMORY, the node
# probes between them (`srun true`) COMPLETED
CAPTURED = """\
632910|FAILED|1:0|||
632910.batch|FAILED|1:0|4864K|0|n1
632910.0|OUT_OF_MEMORY|0:125|1650056K|1|n1
632910.1|COMPLETED|0:0|0|0|n1
632910.2|OUT_OF_MEMORY|0:125|1750212K|1|n1
632910.3|COMPLETED|0:0|0|0|n1
"""


def test_step_rows_parse_into_their_state_peak_rank_and_node():
    steps = parse_steps(CAPTURED)
    assert [s.step_id for s in steps] == [f"632910.{x}" for x in ("batch", 0, 1, 2, 3)]  # not the allocation's
    oom = oom_steps(steps)
    assert [(s.step_id, s.exit_code, s.max_rss, s.rank, s.node) for s in oom] == [
        ("632910.0", "0:125", 1650056 << 10, 1, "n1"),
        ("632910.2", "0:125", 1750212 << 10, 1, "n1"),
    ]
    assert oom[0].text() == "step 632910.0 OUT_OF_MEMORY (exit 0:125), peak 1.6 GiB in rank 1 on n1"
    assert steps[2].text() == "step 632910.1 COMPLETED (exit 0:0)"  # a probe: nothing gathered
    assert rss_bytes("1.50G") == int(1.5 * (1 << 30)) and rss_bytes("") is None and rss_bytes("0") == 0


def test_the_oom_hook_strikes_one_rank_at_one_step_and_fails_loudly_without_a_limit():
    assert injected_oom(1, {OOM_ENV: "1:3"}) == 3 and injected_oom(0, {OOM_ENV: "1:3"}) == 0
    with pytest.raises(ValueError, match="expected rank:step"):
        injected_oom(1, {OOM_ENV: "1"})
    with pytest.raises(RuntimeError, match="4 MiB allocated and not killed: no memory limit"):
        exhaust_memory(1 << 20, 0.0, 4 << 20)  # a process without a limit it can reach


@pytest.fixture(scope="module", params=["22.05", "24.11"], ids=["slurm22", "slurm24"])
def cgroup_cluster(request, tmp_path_factory, site_users):
    """Its own cluster: CR_CPU_Memory and cgroup limits would change what every other test gets.
    On 24.11 from the root `.ci/slurm24 --prepare` builds (skipped without it, except in CI)."""
    why = missing() or cgroups_missing()
    if why:
        pytest.skip(why)
    sysroot = None
    if request.param == "24.11":
        sysroot, why = slurm24_root()
        if sysroot is None:
            if os.environ.get("CI"):
                pytest.fail(f"CI: {why}")
            pytest.skip(why)
    c = SlurmCluster(
        tmp_path_factory.mktemp("slurm-cgroup"),
        sysroot=sysroot,
        cgroups=True,
        users=site_users,
    ).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.mark.slurm
@pytest.mark.slow
def test_a_cgroup_oom_kill_shows_out_of_memory_in_status(cgroup_cluster, digits_root, tmp_path, request):
    request.node.user_properties.append(("slurm", cgroup_cluster.version()))
    run = tmp_path / "oom"
    job = submit(
        cgroup_cluster,
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--cluster-set",
        f"slurm.mem_per_node={MEM}",
        *digits_sets(digits_root, tmp_path, "oom", *JOB_SETS),
        env={"HPCTRAIN_TEST_OOM": "1:3", "HPCTRAIN_MAX_RESTARTS": "1"},
    )
    assert cgroup_cluster.wait_done(job, 600) == "FAILED", job_report(cgroup_cluster, job, run)
    assert sacct_states(cgroup_cluster, job) == ["FAILED"]  # the job's own row: no word of memory
    rows = cgroup_cluster.run("sacct", "-n", "-P", "-D", "-j", job, "-o", ",".join(FIELDS)).stdout
    print(rows)
    steps = [s for s in parse_steps(rows) if s.step_id.split(".")[1].isdigit()]  # not batch, extern
    # the two training steps; the others are the batch shell's node probes (`srun true`) between them
    training = [s for s in steps if s.state == OOM]
    assert len(training) == 2 and {s.state for s in steps} == {OOM, "COMPLETED"}, job_report(cgroup_cluster, job, run)
    for s in training:  # the filling rank's peak, sampled on its way past the limit
        assert (s.rank, s.node) == (1, "n1") and 0 < s.max_rss <= MEM_BYTES, s
    (restart,) = metrics(run, "restart")
    assert restart["nodes"] == [] and restart["attempt"] == 1, restart

    st = hp(cgroup_cluster, "status", job)
    assert st.returncode == 1, st.stdout + st.stderr
    assert f"FAILED (step {training[-1].step_id} OUT_OF_MEMORY)" in st.stdout, st.stdout
    for s in training:
        assert f"step {s.step_id} OUT_OF_MEMORY (exit 0:125), peak " in st.stdout and " in rank 1 on n1" in st.stdout
    assert "last recorded by rank 0 at step 2: host RSS " in st.stdout, st.stdout
    facts = json.loads(hp(cgroup_cluster, "status", job, "--json").stdout)
    assert [(o["step"], o["state"], o["rank"], o["node"]) for o in facts["out_of_memory"]] == [
        (s.step_id, OOM, 1, "n1") for s in training
    ]
    print(st.stdout)

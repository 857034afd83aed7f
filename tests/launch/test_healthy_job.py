"""What the batch shell must never do to a healthy job (docs/spares.md, "Which nodes are left out,
and for how long" and "When slurmctld hiccups").

At a real site nodes are marked FAIL or drained for maintenance under running jobs, slurmds miss a
ping, and the controller stalls: none of that is a fault of the job's nodes. On the Slurm test
cluster, one job (1 training node and 1 spare) lives through an admin marking its batch host FAIL
and draining its spare (the guard and the shell leave both in), then a time-limit stop whose requeue
meets a controller SIGSTOPped for 20 s (the shell's calls time out and are asked again; the requeue
that timed out was carried out), then the batch host of the new allocation hangs (every process on it
SIGSTOPped: its sockets stay silent, as a dead machine's do; the guard on the other node requeues the
job without it). Only the dead node ends up in ExcNodeList. And the exclusions a job
keeps expire, and never leave its partition too small for it.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from hpctrain import shellfile
from hpctrain.launch.inplace import NODE_ERE
from tests.helpers import wait_for
from tests.launch.jobs import (
    JOB_SETS,
    JOB_STEPS,
    batch_host,
    digits_sets,
    job_report,
    metrics,
    sacct_states,
    submit,
    wait_for_step,
)
from tests.slurm_cluster import SPARE_PARTITION, SlurmCluster, slurm24_sysroot

pytestmark = pytest.mark.slurm
SETS = (*JOB_SETS, "ckpt.every=5")
# rank 0 waits 0.5 s per step for data (a sleep: the arithmetic is unchanged): each event lands mid-run,
# and 8 steps take 4 s or more, two polls of the guard (HPCTRAIN_GUARD_S=2) at least, each asking Slurm
# (HPCTRAIN_GUARD_ASK_S=2: by default it asks once a minute while the batch shell's heartbeat moves)
SLOW_DATA = {"HPCTRAIN_TEST_DELAY": "0:0.5:data", "HPCTRAIN_GUARD_S": "2", "HPCTRAIN_GUARD_ASK_S": "2"}
STALL_S = 20  # longer than a client waits (MessageTimeout 10 s): each call of the shell's times out
# A site's order of SlurmdTimeout (Slurm's default: 300 s) on the 24.11 cluster: above 2 × MessageTimeout
# (the ping agent's wait on a hung node, measured ~21 s) + the ping interval (a third of it). With the
# session cluster's 10 s, 24.11 set every node DOWN while its ping agent waited on the hung one, and
# requeued the job itself (docs/spares.md, "The guard on Slurm 24.11").
SITE_SLURMD_TIMEOUT = 60


def batch_output(run, job: str) -> str:
    """The batch shell's output and error files (the guard, on another node, appends to the latter)."""
    paths = [*sorted((run / "submitit").glob(f"{job}_*_log.*")), *(run / ".hpctrain").glob(f"guard-{job}.log")]
    return "".join(p.read_text(errors="replace") for p in paths)


def submit_spare_job(c, digits_root, tmp_path, name: str) -> str:
    """A job of 1 training node and 1 spare on the spares partition, rank 0 slowed (SLOW_DATA)."""
    sets = digits_sets(digits_root, tmp_path, name, *SETS)
    return submit(c, "--partition", SPARE_PARTITION, "--nodes", "1", "--spare-nodes", "1", "--gpus-per-node", "2",
                  *sets, env=SLOW_DATA)  # fmt: skip


def assert_requeued_by_the_guard_without(c, job: str, run, dead: str, restarts: int) -> str:
    """The job ended COMPLETED after `restarts` requeues, the last by the guard, with only the hung
    host excluded; the run trained to its end without an exclude or restart of its own. Returns the
    batch output."""
    out = batch_output(run, job)
    show = c.run("scontrol", "show", "job", "-o", job).stdout
    # sacct may fold the guard's requeue of a dead node's allocation into one row
    assert re.search(rf"\bRestarts={restarts}\s", show) and sacct_states(c, job)[-1] == "COMPLETED", show
    assert sorted(p.name for p in (run / "attempts").glob("env-*.json")) == [
        f"env-{job}-{r}-0.json" for r in range(restarts + 1)
    ], job_report(c, job, run)
    assert re.search(rf"\bExcNodeList={dead}\s", show), show
    # NOT_RESPONDING with the shell's heartbeat stopped, or DOWN once SlurmdTimeout has passed
    assert re.search(rf"the batch host {dead} is \S*(DOWN|NOT_RESPONDING)\S* and its shell's heartbeat stopped", out), (
        out
    )
    assert metrics(run, "exclude") == [] and metrics(run, "restart") == [], job_report(c, job, run)
    assert metrics(run, "end")[-1]["status"] == "finished" and metrics(run, "train")[-1]["step"] == JOB_STEPS
    return out


@pytest.mark.slow
def test_a_failing_batch_host_a_draining_spare_and_a_stalled_controller_leave_a_healthy_job_alone(
    slurm_cluster, digits_root, tmp_path
):
    c = slurm_cluster
    run = tmp_path / "healthy"
    job = submit_spare_job(c, digits_root, tmp_path, "healthy")

    def report():
        return job_report(c, job, run)

    drained = dead = None
    try:
        # 1. an admin marks the batch host FAIL ("expected to fail soon": its jobs run on) and drains the
        # spare: the guard polls at least twice and leaves the job alone
        wait_for_step(run, 5, 240)
        host = batch_host(c, job)
        nodes = c.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()
        (spare,) = [n for n in c.run("scontrol", "show", "hostnames", nodes).stdout.split() if n != host]
        c.run("scontrol", "update", f"nodename={host}", "state=FAIL", "reason=hpctrain-test-failing")
        c.run("scontrol", "update", f"nodename={spare}", "state=DRAIN", "reason=hpctrain-test-maintenance")
        drained = spare
        step = wait_for_step(run, 5, 240)
        wait_for_step(run, step + 8, 300)
        assert "+FAIL" in c.run("scontrol", "show", "node", "-o", host).stdout
        c.run("scontrol", "update", f"nodename={host}", "state=RESUME")
        assert c.state(job) == "RUNNING" and sacct_states(c, job) == ["RUNNING"], report()

        # 2. a time-limit stop; the controller stalls as the shell requeues (its calls time out)
        c.run("scancel", "--signal=USR2", "--batch", job)
        (stop,) = wait_for(lambda: metrics(run, "stop"), "no stop record", 300, report, poll_s=0.1)
        c.pause_slurmctld(STALL_S)
        wait_for(
            lambda: (run / "attempts" / f"env-{job}-1-0.json").is_file(),
            "the requeued job did not start",
            300,
            report,
        )
        c.run("scontrol", "update", f"nodename={spare}", "state=RESUME")
        drained = None

        # 3. the new allocation's batch host dies: the guard on the other node requeues the job without it
        wait_for_step(run, stop["step"] + 3, 300)
        dead = batch_host(c, job)
        assert c.freeze_node(dead) >= 2, report()  # slurmd, slurmstepd, the batch shell, the tasks
        assert c.wait_done(job, 600) == "COMPLETED", report()
    finally:
        if drained:
            c.run("scontrol", "update", f"nodename={drained}", "state=RESUME", check=False)
        if dead:
            c.kill_node(dead)
            c.revive_node(dead)

    # three allocations; only the hung host excluded: neither the FAIL host nor the drained spare
    out = assert_requeued_by_the_guard_without(c, job, run, dead, restarts=2)
    assert "slurmctld did not answer" in out and "Socket timed out" in out, out


@pytest.fixture(scope="module")
def site_timeout_cluster24(tmp_path_factory, site_users):
    """Its own Slurm 24.11 cluster with a site's order of SlurmdTimeout (SITE_SLURMD_TIMEOUT)."""
    c = SlurmCluster(
        tmp_path_factory.mktemp("slurm24-guard"),
        sysroot=slurm24_sysroot(),
        slurmd_timeout=SITE_SLURMD_TIMEOUT,
        users=site_users,
    ).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.mark.slow
def test_on_slurm_24_the_guard_requeues_a_job_whose_batch_host_hangs(site_timeout_cluster24, digits_root, tmp_path):
    """Slurm 24.11: the batch host of a job with a spare hangs (every process on it SIGSTOPped). The
    guard on the other node sees it NOT_RESPONDING with the batch shell's heartbeat stopped (or DOWN,
    once SlurmdTimeout has passed) and requeues the job without it; the job trains to its end on the
    spare and the third node. Without the guard the --no-kill job would sit RUNNING with no batch
    shell until its time limit (docs/spares.md)."""
    c = site_timeout_cluster24
    config = c.run("scontrol", "show", "config").stdout
    assert "24.11" in c.version() and re.search(rf"SlurmdTimeout\s+= {SITE_SLURMD_TIMEOUT} sec", config), config
    run = tmp_path / "guard24"
    job = submit_spare_job(c, digits_root, tmp_path, "guard24")

    def report():
        return job_report(c, job, run)

    dead = None
    try:
        wait_for_step(run, 7, 300)
        dead = batch_host(c, job)
        assert c.freeze_node(dead) >= 2, report()  # slurmd, slurmstepd, the batch shell, the tasks
        assert c.wait_done(job, 900) == "COMPLETED", report()
    finally:
        if dead:
            c.kill_node(dead)
            c.revive_node(dead)

    assert_requeued_by_the_guard_without(c, job, run, dead, restarts=1)


def exc_list(cluster, control, job_nodes: int, old: str, **env: str) -> str:
    """What the batch shell's exclude.sh writes to ExcNodeList, run by bash on the test cluster's
    Slurm (its `scontrol show partition` and `scontrol show hostnames`)."""
    prog = shellfile.program(
        ["signals.sh", "slurm_call.sh", "ctld.sh", "exclude.sh"],
        [shellfile.assign("hpctrain_node_name", NODE_ERE), "hpctrain_job=none"],
    )
    env = cluster.environ(
        {
            "HPCTRAIN_CONTROL_DIR": str(control),
            "SLURM_JOB_ID": "77",
            "SLURM_JOB_PARTITION": SPARE_PARTITION,
            "SLURM_JOB_NUM_NODES": str(job_nodes),
            **env,
        }
    )
    r = subprocess.run(
        ["bash", "-c", prog + 'hpctrain_exc_list "$1"', "exc", old], env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_a_job_name_holding_key_value_pairs_does_not_answer_for_the_job(slurm_cluster, tmp_path):
    """`scontrol show job -o` prints JobName= before JobState=: a job named 'x JobState=COMPLETED'
    answered "COMPLETED" to the batch shell's field reads (the first match won), and a running job
    would have been taken for one Slurm had ended. hpctrain_job_field cuts the job's own name
    ($SLURM_JOB_NAME) out first."""
    name = "x JobState=COMPLETED Restarts=9"
    job = slurm_cluster.run("sbatch", "--parsable", "--hold", "-J", name, "--wrap", "true").stdout.strip()
    try:
        prog = shellfile.program(["signals.sh", "slurm_call.sh", "ctld.sh"], [shellfile.assign("hpctrain_job", job)])
        env = slurm_cluster.environ({"SLURM_JOB_NAME": name})
        r = subprocess.run(
            ["bash", "-c", prog + 'echo "$(hpctrain_job_field JobState) $(hpctrain_job_field Restarts)"'],
            env=env,
            capture_output=True,
            text=True,
        )
        assert r.stdout.split() == ["PENDING", "0"], (r.stdout, r.stderr)
    finally:
        slurm_cluster.run("scancel", job, check=False)


def test_exclusions_expire_and_never_leave_the_partition_too_small_for_the_job(slurm_cluster, tmp_path):
    """The spares partition has 3 nodes. A job excluded n1 7 h ago, n2 and n3 minutes ago; the user
    excluded n7 at submission. A 2-node job keeps one exclusion of its own (3 - 2), the newest; a
    1-node job two, without the expired n1; with a longer HPCTRAIN_EXCLUDE_S, n1 again once there is
    room. Before, the shell appended every node it named to ExcNodeList for the job's life: a 2-node
    job with two nodes excluded on a 3-node partition never started again (BadConstraints)."""
    now = int(time.time())
    (tmp_path / "excluded-77").write_text(
        f"{now - 7 * 3600}\tn1\tprobe failed\n{now - 200}\tn2\tleft the allocation\n{now - 100}\tn3\tDOWN\n"
    )
    assert exc_list(slurm_cluster, tmp_path, 2, "n7") == "n7,n3"
    assert exc_list(slurm_cluster, tmp_path, 1, "n7") == "n7,n3,n2"
    assert exc_list(slurm_cluster, tmp_path, 1, "n[2-3],n7") == "n7,n3,n2"  # Slurm's ranges; ours not counted twice
    assert exc_list(slurm_cluster, tmp_path, 0, "", HPCTRAIN_EXCLUDE_S="86400") == "n3,n2,n1"
    assert exc_list(slurm_cluster, tmp_path, 3, "n7") == "n7"  # the job needs every node

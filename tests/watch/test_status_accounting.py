"""`hpctrain status` where sacct cannot answer or answers for other jobs: no accounting storage,
slurmdbd down, a job id that an older job already had (the controller's counter started again),
and a job that ran on another cluster than the login node's (sacct ignores SLURM_CLUSTERS).

Each test on a cluster of its own: the id reset wipes the controller's state, and accounting off
would change what every other test gets (docs/observability.md, "hpctrain status")."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

from hpctrain.launch.submit import write_job_record
from hpctrain.watch.follow import pace_of, wait_job
from tests.helpers import wait_for
from tests.launch.jobs import digits_sets, hp, job_report, submit
from tests.slurm_cluster import SlurmCluster, missing

pytestmark = pytest.mark.slurm

NO_ACCOUNTING = "AccountingStorageType=accounting_storage/none"  # a later key wins (slurm.conf read, measured)
WAIT_FOR_FILE = "while [ ! -e release ]; do sleep 0.2; done"  # runs until the test releases it


def own_cluster(root: Path, conf_extra: str = ""):
    why = missing()
    if why:
        pytest.skip(why)
    c = SlurmCluster(root, conf_extra=conf_extra).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def no_accounting(tmp_path_factory):
    """A cluster without accounting storage: slurmctld stores no job records anywhere."""
    yield from own_cluster(tmp_path_factory.mktemp("slurm-no-acct"), NO_ACCOUNTING)


@pytest.fixture(scope="module")
def dbd_cluster(tmp_path_factory):
    """A cluster with slurmdbd whose controller the tests reset and whose slurmdbd they stop."""
    yield from own_cluster(tmp_path_factory.mktemp("slurm-reset"))


def scontrol_state(cluster, job: str) -> str:
    out = cluster.run("scontrol", "show", "job", "-o", job, check=False).stdout
    m = re.search(r"\bJobState=(\S+)", out)
    return m.group(1) if m else ""


def run_job(cluster, run: Path, cmd: str = WAIT_FOR_FILE, record: dict | None = None) -> str:
    """A batch job in `run` (its working directory, as `hpctrain submit` runs it), recorded in the
    run's job.json as `hpctrain submit` records its jobs (launch/submit.py write_job_record)."""
    run.mkdir(parents=True, exist_ok=True)
    job = cluster.run(
        "sbatch", "--parsable", f"--chdir={run}", "--output=/dev/null", "-N1", "--wrap", cmd
    ).stdout.strip()
    rec = {"job_id": job, "executor": "slurm", "nodes": 1, "submitit": str(run / "submitit"), **(record or {})}
    write_job_record(run, rec)
    return job


def status(cluster, target: str, env: dict | None = None) -> tuple[str, dict]:
    """`hpctrain status` as text (checked: no traceback, one line per fact) and as --json."""
    r = hp(cluster, "status", target, env=env)
    assert "Traceback" not in r.stderr and r.stdout.startswith("hpctrain status"), r.stdout + r.stderr
    j = hp(cluster, "status", target, "--json", env=env)
    assert "Traceback" not in j.stderr, j.stderr
    return r.stdout, json.loads(j.stdout)


def test_status_without_accounting_storage_takes_the_controllers_state(no_accounting, tmp_path):
    """sacct exits 1 with "Slurm accounting storage is disabled": the state is scontrol's (RUNNING,
    then COMPLETED while the controller keeps the ended job, MinJobAge), and status says so."""
    cluster, run = no_accounting, tmp_path / "run"
    r = cluster.run("sacct", "-n", "-j", "1", check=False)
    assert r.returncode != 0 and "accounting storage is disabled" in r.stderr, r  # the property itself
    job = run_job(cluster, run)
    wait_for(lambda: scontrol_state(cluster, job) == "RUNNING", f"job {job} running", show=lambda: status(cluster, job))
    text, facts = status(cluster, str(run))
    assert facts["state"] == "RUNNING" and facts["requeues"] == 0 and facts["nodes"], text
    assert facts["accounting"] == (
        "sacct cannot answer (Slurm accounting storage is disabled): state from scontrol/squeue; "
        "requeue history not shown"
    )
    assert re.search(r"(?m)^ +state +RUNNING$", text) and "accounting     sacct cannot answer" in text, text
    by_id, _ = status(cluster, job)  # the job id finds the run (its WorkDir, from scontrol)
    assert f"run directory  {run.resolve()}" in by_id, by_id
    (run / "release").touch()
    wait_for(lambda: scontrol_state(cluster, job) == "COMPLETED", f"job {job} done", show=lambda: status(cluster, job))
    text, facts = status(cluster, str(run))
    assert facts["state"] == "COMPLETED" and facts["accounting"], text


def test_a_follower_waits_through_a_requeue_and_reads_the_end_from_the_controller(no_accounting, tmp_path, monkeypatch):
    """`submit --wait`'s and `eval --wait`'s follower (watch/follow.py) without accounting: a job
    requeued while it runs keeps the wait going (PENDING again after RUNNING), and its end state is
    the controller's record (scontrol), as `hpctrain status` takes it."""
    cluster, run = no_accounting, tmp_path / "run"
    for k, v in cluster.environ().items():  # the follower's squeue/sacct/scontrol: this cluster's
        monkeypatch.setenv(k, v)
    run.mkdir()
    job = cluster.run(
        "sbatch",
        "--parsable",
        "--requeue",
        f"--chdir={run}",
        "--output=/dev/null",
        "-N1",
        "--wrap",
        f"if [ -e once ]; then {WAIT_FOR_FILE}; exit 0; fi; touch once; sleep 600",  # the 2nd run: till released
    ).stdout.strip()
    got: list[str] = []
    waiter = threading.Thread(target=lambda: got.append(wait_job(job, pace_of(5), tick_s=0.5)), daemon=True)
    waiter.start()
    wait_for(lambda: scontrol_state(cluster, job) == "RUNNING" and (run / "once").exists(), f"job {job} running")
    cluster.run("scontrol", "requeue", job)
    wait_for(lambda: "Restarts=1" in cluster.run("scontrol", "show", "job", "-o", job).stdout, "no requeue")
    wait_for(lambda: scontrol_state(cluster, job) == "RUNNING", f"job {job} running again")
    waiter.join(timeout=20)
    assert waiter.is_alive() and not got, got  # requeued, not ended: still waiting
    (run / "release").touch()
    waiter.join(timeout=300)
    assert got == ["COMPLETED"] and scontrol_state(cluster, job) == "COMPLETED", (got, scontrol_state(cluster, job))


def test_status_after_a_job_id_reset_counts_this_runs_rows_only(dbd_cluster, tmp_path):
    """The controller loses its state and counts from FirstJobId again: the new job gets the id of
    an older, failed one, and `sacct -D -j ID` lists both. Status shows the new job's state, no
    requeue, its node; by id too."""
    cluster = dbd_cluster
    old_run, run = tmp_path / "old", tmp_path / "new"
    old = run_job(cluster, old_run, "exit 3")
    assert cluster.wait_done(old, 60) == "FAILED"
    wait_for(  # slurmdbd fills WorkDir in a moment after the job's start
        lambda: str(old_run) in cluster.run("sacct", "-n", "-X", "-P", "-j", old, "-o", "WorkDir").stdout,
        f"job {old}'s WorkDir in sacct",
    )
    cluster.reset_job_ids(int(old))
    job = run_job(cluster, run)
    assert job == old  # the property: two jobs of one id in accounting
    wait_for(
        lambda: len(rows := sacct_rows_of(cluster, job)) == 2 and rows[-1][1] == "RUNNING",
        f"both jobs {job} in sacct, the new one running",
        show=lambda: sacct_rows_of(cluster, job),
    )
    text, facts = status(cluster, str(run))
    assert (facts["state"], facts["requeues"], facts.get("accounting")) == ("RUNNING", 0, None), text
    assert facts["nodes"] == sacct_rows_of(cluster, job)[-1][2], text
    text, facts = status(cluster, job)  # by id: the newest job of that id, and its run
    assert (facts["state"], facts["requeues"], facts["run_dir"]) == ("RUNNING", 0, str(run.resolve())), text
    (run / "release").touch()
    assert cluster.wait_done(job, 60) == "COMPLETED"
    _, facts = status(cluster, str(run))
    assert (facts["state"], facts["requeues"]) == ("COMPLETED", 0), facts
    _, facts = status(cluster, str(old_run))  # the old run's own row
    assert (facts["state"], facts["requeues"]) == ("FAILED", 0), facts


def test_status_with_slurmdbd_down_takes_the_controllers_state(dbd_cluster, tmp_path):
    """slurmdbd stopped: sacct exits 1 ("Problem talking to the database"); the state is scontrol's."""
    cluster, run = dbd_cluster, tmp_path / "run"
    job = run_job(cluster, run)
    wait_for(lambda: scontrol_state(cluster, job) == "RUNNING", f"job {job} running")
    with cluster.slurmdbd_down():
        r = cluster.run("sacct", "-n", "-j", job, check=False)
        assert r.returncode != 0 and "Problem talking to the database" in r.stderr, r
        text, facts = status(cluster, str(run))
        assert facts["state"] == "RUNNING" and "Problem talking to the database" in facts["accounting"], text
        (run / "release").touch()
        wait_for(lambda: scontrol_state(cluster, job) == "COMPLETED", f"job {job} done")
        _, facts = status(cluster, str(run))
        assert facts["state"] == "COMPLETED", facts


def test_status_of_a_job_on_another_cluster_asks_sacct_there(dbd_cluster, digits_root, tmp_path):
    """`hpctrain submit` with SLURM_CLUSTERS (sbatch: --clusters) records the clusters; the login
    node of cluster `login` (its slurm.conf: that ClusterName, no way to the job's controller)
    shares slurmdbd with the cluster the job ran on. sacct reads no SLURM_CLUSTERS: only -M with
    the cluster the job record names finds the job."""
    cluster, run = dbd_cluster, tmp_path / "run"
    sets = digits_sets(digits_root, tmp_path, "run", "train.max_steps=4", "log.every=2")
    job = submit(cluster, "--nodes", "1", "--gpus-per-node", "2", *sets, env={"SLURM_CLUSTERS": cluster.cluster_name})
    assert cluster.wait_done(job, 600) == "COMPLETED", job_report(cluster, job, run)
    assert json.loads((run / "job.json").read_text())["slurm_clusters"] == cluster.cluster_name
    assert json.loads((run / "env.json").read_text())["env"]["SLURM_CLUSTER_NAME"] == cluster.cluster_name
    login = tmp_path / "login.conf"
    conf = re.sub(r"(?m)^ClusterName=\S+$", "ClusterName=login", cluster.conf.read_text())
    login.write_text(re.sub(r"(?m)^SlurmctldPort=\d+$", "SlurmctldPort=1", conf))
    env = {"SLURM_CONF": str(login), "SLURM_CLUSTERS": cluster.cluster_name}
    r = cluster.run("sacct", "-n", "-X", "-P", "-j", job, "-o", "State", env=env)
    assert r.stdout.strip() == "", r  # the property: SLURM_CLUSTERS does not reach sacct
    text, facts = status(cluster, str(run), env=env)
    assert (facts["state"], facts["requeues"], facts.get("accounting")) == ("COMPLETED", 0, None), text
    assert facts["step"] == 4 and facts["nodes"], text


def sacct_rows_of(cluster, job: str) -> list[tuple[str, str, str]]:
    """(WorkDir, State, NodeList) of every job of that id, oldest first."""
    out = cluster.run("sacct", "-n", "-X", "-P", "-D", "-j", job, "-o", "WorkDir,State,NodeList", check=False).stdout
    return [tuple(line.split("|")) for line in out.splitlines() if line.count("|") == 2]

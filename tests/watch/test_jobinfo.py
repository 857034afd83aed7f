"""Which job of an id is the run's, and where sacct must look for it (watch/jobinfo.py); the
Slurm side of each: tests/watch/test_status_accounting.py. A preempted job that Slurm requeues is
not reported ended (job_state, on a real Slurm 24.11 cluster)."""

from __future__ import annotations

import json
import time

import pytest

from hpctrain.watch.follow import TERMINAL
from hpctrain.watch.jobinfo import Where, job_state, own_rows, sacct_args, sacct_rows, submitted_clusters, where_of
from tests.helpers import WAIT_S, wait_for
from tests.launch.jobs import sacct_states
from tests.slurm_cluster import PREEMPTIBLE, URGENT


def test_submission_clusters_come_from_sbatchs_variables():
    """sbatch(1): SBATCH_CLUSTERS or SLURM_CLUSTERS act as --clusters; neither: the local cluster."""
    assert submitted_clusters({}) is None
    assert submitted_clusters({"SLURM_CLUSTERS": "b"}) == "b"
    assert submitted_clusters({"SBATCH_CLUSTERS": "c", "SLURM_CLUSTERS": "b"}) == "c"


def test_sacct_is_told_the_cluster_and_the_rows_are_this_jobs(tmp_path):
    assert sacct_args("7")[:6] == ["sacct", "-n", "-X", "-P", "-D", "-j"]
    assert sacct_args("7", Where("b,c"))[5:9] == ["-M", "b,c", "-j", "7"]
    rows = [{"WorkDir": str(tmp_path / "old")}, {"WorkDir": str(tmp_path / "run")}, {"WorkDir": ""}]
    assert own_rows(rows, str(tmp_path / "run")) == rows[1:]  # a row without WorkDir yet stays
    assert own_rows(rows, None) == rows


def test_where_a_run_s_job_ran_from_its_records(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    assert where_of(run) == Where()
    (run / "job.json").write_text(json.dumps({"job_id": "7", "submitit": str(run / "submitit")}))
    assert where_of(run) == Where(None, str(run))
    env = {"SLURM_JOB_ID": "7", "SLURM_CLUSTER_NAME": "b", "HPCTRAIN_CONTROL_DIR": str(tmp_path / "wd" / ".hpctrain")}
    (run / "env.json").write_text(json.dumps({"env": env}))
    assert where_of(run) == Where("b", str(tmp_path / "wd"))  # plain sbatch: the control dir's parent
    (run / "job.json").write_text(json.dumps({"job_id": "8", "slurm_clusters": "c"}))
    assert where_of(run) == Where("c", None)  # env.json of an earlier job: not this one's


@pytest.mark.slurm
def test_a_preempted_job_that_slurm_requeues_is_not_reported_ended(slurm24_cluster, tmp_path, monkeypatch):
    """A --requeue job in the preemptible partition ignores SIGTERM and is killed at the end of its
    GraceTime; Slurm requeues it. Its last sacct row is PREEMPTED for seconds before the next run's
    row appears, while squeue holds it: `job_state` (status, submit --wait) must not call that an
    end. Same on 22.05 (measured); run on 24.11 only, where our batch shell leaves preempted jobs'
    requeues to Slurm (docs/slurm-versions.md)."""
    cluster = slurm24_cluster
    for k, v in cluster.environ().items():  # job_state runs sacct/squeue from this environment
        monkeypatch.setenv(k, v)
    job = cluster.run(
        "sbatch",
        "--parsable",
        f"--partition={PREEMPTIBLE}",
        "-N2",
        "--requeue",
        f"--output={tmp_path}/%j.out",
        "--wrap",
        "trap '' TERM; sleep 300",
        cwd=tmp_path,
    ).stdout.strip()
    wait_for(lambda: cluster.state(job) == "RUNNING", f"job {job} never ran", show=lambda: sacct_rows(job), poll_s=0.2)
    t0 = time.monotonic()
    cluster.run(
        "sbatch",
        f"--partition={URGENT}",
        "-N2",
        "--exclusive",
        f"--output={tmp_path}/%j.out",
        "--wrap",
        "sleep 2",
        cwd=tmp_path,
    )
    seen, window = [], False
    while not (seen and seen[-1] == "RUNNING" and len(sacct_states(cluster, job)) == 2):
        assert time.monotonic() - t0 < WAIT_S, seen  # a cap on the wait (generous), not a timing
        rows = [r["State"] for r in sacct_rows(job)]
        window |= rows[-1:] == ["PREEMPTED"]
        st = job_state(job)
        seen += [st] if not seen or seen[-1] != st else []
        assert st not in TERMINAL, (seen, rows)
        time.sleep(0.1)
    cluster.run("scancel", job)
    assert sacct_states(cluster, job)[0] == "PREEMPTED" and window, seen

"""Which job of an id is the run's, and where sacct must look for it (watch/jobinfo.py); the
Slurm side of each: tests/watch/test_status_accounting.py."""

from __future__ import annotations

import json

from hpctrain.watch.jobinfo import Where, own_rows, sacct_args, submitted_clusters, where_of


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

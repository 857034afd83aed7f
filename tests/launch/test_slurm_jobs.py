"""Real multi-node jobs on the session's Slurm test cluster (2 nodes n1, n2; gloo on loopback)."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from tests.helpers import WAIT_S, as_typed_at_a_terminal
from tests.launch.jobs import check_run_dir, digits_sets, hp, metrics, submit, wait_for_step

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slurm
ACC_EPOCHS = 14


@pytest.mark.slow
def test_submit_two_nodes_trains_digits_to_95(slurm_cluster, digits_root, tmp_path):
    """The must-show run: `hpctrain submit --nodes 2 --gpus-per-node 2` picks Slurm by itself."""
    job = submit(
        slurm_cluster,
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        *digits_sets(digits_root, tmp_path, "acc", f"train.epochs={ACC_EPOCHS}"),
    )
    assert slurm_cluster.wait_done(job, 400) == "COMPLETED"
    run = tmp_path / "acc"
    check_run_dir(run, 4)
    end = metrics(run, "end")[-1]
    assert end["status"] == "finished" and end["top1"] >= 95.0, end
    assert json.loads((run / "job.json").read_text())["job_id"] == job
    st = hp(slurm_cluster, "status", job)
    assert st.returncode == 0 and "COMPLETED" in st.stdout and str(run) in st.stdout, st.stdout
    assert "requeues       0" in st.stdout
    logs = hp(slurm_cluster, "logs", str(run), "--rank", "3")
    assert "rank 3 on host n2" in logs.stdout
    follow = hp(slurm_cluster, "logs", job, "-f")  # the job has ended: prints rank 0's log, returns
    assert follow.returncode == 0 and "rank 0 on host n1" in follow.stdout and "eval step" in follow.stdout
    print(f"2 nodes x 2 tasks, {ACC_EPOCHS} epochs: val top-1 {end['top1']:.2f} %")


@pytest.fixture(scope="module")
def modulefiles(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("modulefiles")
    (d / "hpctest.lua").write_text('setenv("HPCTRAIN_MODULE_MARK", "loaded by Lmod: hpctest")\n')
    return d


def test_sbatch_script_with_overrides(slurm_cluster, digits_root, tmp_path, modulefiles):
    """`sbatch slurm/vit.sbatch` as committed: nodes/tasks/GPUs on the command line, the rest from
    the environment; the test modulefile's variable reaches every task."""
    sets = json.dumps(
        [f"data.root={digits_root}", f"run.dir={tmp_path}", "run.name=sb", "train.epochs=1", "train.threads=1"]
    )
    env = {
        "CONTAINER": "none",
        "HPCTRAIN_MODULES": "hpctest",
        "MODULEPATH": str(modulefiles),
        "HPCTRAIN_CONFIG": str(ROOT / "configs" / "digits_vit.yaml"),
        "HPCTRAIN_SET": sets,
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
    }
    r = slurm_cluster.run(
        "sbatch",
        "--nodes=2",
        "--ntasks-per-node=2",
        "--gpus-per-node=0",
        "--cpus-per-task=1",
        f"--partition={slurm_cluster.partition}",
        f"--output={tmp_path}/slurm-%j.out",
        str(ROOT / "slurm" / "vit.sbatch"),
        env=env,
        cwd=tmp_path,
    )  # the job writes .hpctrain/ there
    job = r.stdout.split()[-1]
    assert slurm_cluster.wait_done(job, 300) == "COMPLETED", (tmp_path / f"slurm-{job}.out").read_text()
    run = tmp_path / "sb"
    check_run_dir(run, 4)
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert f"hpctrain: job {job} (restart 0) on n[1-2]: 2 nodes x 2 tasks; modules: hpctest" in out
    rec = json.loads((run / "env.json").read_text())["env"]
    assert rec["HPCTRAIN_MODULE_MARK"] == "loaded by Lmod: hpctest" and rec["LOADEDMODULES"] == "hpctest"
    assert rec["SLURM_JOB_ID"] == job
    st = hp(slurm_cluster, "status", str(run))
    assert "COMPLETED" in st.stdout and f"{job} (slurm)" in st.stdout, st.stdout


HOSTILE = 'it\'s a "run" $(touch PWNED) `touch PWNED2`; touch PWNED3 & x'


def test_hostile_names_and_values_arrive_intact(slurm_cluster, digits_root, tmp_path):
    import yaml

    prof = tmp_path / "evil.yaml"
    prof.write_text(
        yaml.safe_dump(
            {"slurm": {"request_gpus": False, "gpus_per_node": 1, "time": "10"}, "env": {"HPCTRAIN_EVIL": HOSTILE}}
        )
    )
    parent = tmp_path / f"dir {HOSTILE}"
    job = submit(
        slurm_cluster,
        "--cluster",
        str(prof),
        "--nodes",
        "1",
        *digits_sets(digits_root, parent, HOSTILE, "train.max_steps=1"),
    )
    assert slurm_cluster.wait_done(job, 120) == "COMPLETED"
    run = parent / HOSTILE
    assert json.loads((run / "env.json").read_text())["env"]["HPCTRAIN_EVIL"] == HOSTILE
    # the controller holds the name as given (accounting shows `"` as a backquote: Slurm's own doing)
    shown = slurm_cluster.run("scontrol", "show", "job", "-o", job).stdout
    assert re.search(r"JobName=(.*) UserId=", shown).group(1) == HOSTILE
    assert not [p for p in tmp_path.rglob("PWNED*")] and not list(ROOT.glob("PWNED*"))


def test_a_failing_job_under_submit_wait_says_why_in_one_line(slurm_cluster, digits_root, tmp_path):
    """The task's UserError travels back from the nodes as its one line (no traceback), with the
    failing rank's log; the job itself is FAILED for Slurm."""
    r = hp(
        slurm_cluster,
        "submit",
        "--config",
        "configs/digits_vit.yaml",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--wait",
        *digits_sets(digits_root, tmp_path, "bad", "run.resume=/nonexistent/ckpt.pt"),
        timeout=300,
    )
    job = re.search(r"submitted Slurm job (\d+)", r.stdout).group(1)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stdout + r.stderr
    log = tmp_path / "bad" / "submitit" / f"{job}_0_log.err"
    assert r.stderr.strip().splitlines()[-1] == (
        "hpctrain: error: run.resume='/nonexistent/ckpt.pt': no such checkpoint; give auto, none or a checkpoint path "
        f"(Slurm job {job}, rank 0; log: {log})"
    )
    assert "FAILED" in r.stdout


def test_ctrl_c_of_submit_wait_leaves_the_slurm_job_running_and_says_how_to_stop_it(
    slurm_cluster, digits_root, tmp_path
):
    import subprocess
    import sys

    e = {k: v for k, v in slurm_cluster.env.items() if k != "HPCTRAIN_CLUSTER"}
    waiter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpctrain",
            "submit",
            "--config",
            "configs/digits_vit.yaml",
            "--cluster",
            "local",
            "--wait",
            *digits_sets(digits_root, tmp_path, "goes-on", "train.max_steps=2000"),
        ],
        env={**e, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=as_typed_at_a_terminal,
    )
    wait_for_step(tmp_path / "goes-on", 1, 180)
    job = json.loads((tmp_path / "goes-on" / "job.json").read_text())["job_id"]
    try:
        os.killpg(waiter.pid, signal.SIGINT)  # a terminal's Ctrl-C
        out, err = waiter.communicate(timeout=WAIT_S)  # a bound for a hang; it ends at once when all is well
        assert waiter.returncode == 130, out + err
        assert (
            f"Slurm job {job} goes on. Follow it: hpctrain logs {tmp_path / 'goes-on'} -f   stop it (checkpoint "
            f"first): scancel --signal=USR2 {job}   end it now: scancel {job}"
        ) in err, err
        assert slurm_cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING"
    finally:  # pass or fail: a job left running would hold the test cluster's nodes for minutes
        slurm_cluster.run("scancel", job)

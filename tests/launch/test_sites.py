"""Sites differ (docs/sites.md, "Summary"): each test puts the session's Slurm test cluster (or the
submitting environment) in one site's shape and shows that a short digits job still trains and
requeues as it should."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import pytest

from hpctrain import shellfile
from tests.launch.jobs import ROOT, digits_sets, hp, job_report, metrics, sacct_states, submit
from tests.slurm_cluster import DEF_MEM_PER_CPU, EXPORT_NONE, PREEMPTIBLE, URGENT

pytestmark = pytest.mark.slurm
SHORT = ("train.epochs=1", "train.max_steps=10", "log.every=1", "train.eval_every_epochs=0", "ckpt.every=0")


def training(cluster, job: str, run: Path, step: int = 3, timeout: float = 180) -> None:
    """Wait until the run has trained `step` steps; fail at once when the job ended before."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(r["step"] >= step for r in metrics(run, "train")):
            return
        state = cluster.state(job)
        assert state in ("", "PENDING", "RUNNING", "REQUEUED"), f"job {job} is {state} before step {step}"
        time.sleep(0.5)
    raise TimeoutError(f"{run} did not reach step {step} in {timeout} s")


def test_export_none_site_trains_and_requeues(each_slurm_cluster, digits_root, tmp_path):
    """SBATCH_EXPORT=NONE in the submitting shell (a site default): the batch shell starts with only
    SLURM_* and its srun would pass only SLURM_* on to the tasks (SLURM_EXPORT_ENV=NONE). The tasks
    still get the script's SUBMITIT_*/HPCTRAIN_* and the submitting code, and a USR2 stop requeues.
    On Slurm 22.05 and 24.11 (srun's environment rules are version-dependent)."""
    slurm_cluster = each_slurm_cluster
    job = submit(
        slurm_cluster,
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        # 40 steps: the USR2 sent after step 3 must find it still training (10 steps took 7 s)
        *digits_sets(digits_root, tmp_path, "xnone", *SHORT, "train.max_steps=40"),
        env={**EXPORT_NONE, "HPCTRAIN_LOGIN_SHELL_MARK": "set at submission"},
    )
    run = tmp_path / "xnone"
    training(slurm_cluster, job, run)
    slurm_cluster.run("scancel", "--signal=USR2", job)
    assert slurm_cluster.wait_done(job, 240) == "COMPLETED", sacct_states(slurm_cluster, job)
    assert sacct_states(slurm_cluster, job) == ["REQUEUED", "COMPLETED"]
    (req,) = metrics(run, "requeue")
    assert req["requeue"] and req["reason"] == "time_limit" and req["step"] < 40
    env = json.loads((run / "env.json").read_text())["env"]
    assert "HPCTRAIN_LOGIN_SHELL_MARK" not in env  # the site's NONE did apply to the job
    assert env["HPCTRAIN_STOP_FILE"].endswith(f"stop-{job}") and env["HPCTRAIN_LAUNCHER"] == "submitit-slurm"


def test_export_none_job_says_the_users_overrides_cannot_reach_it(slurm_cluster, tmp_path):
    """slurm/vit.sbatch's first lines (shell/overrides.sh) as a batch job, submitted from a shell with
    SBATCH_EXPORT=NONE and HPCTRAIN_CONFIG exported: the job has SLURM_EXPORT_ENV=NONE and no
    HPCTRAIN_CONFIG (the defaults would run), and says so; with `sbatch --export=ALL`, as it advises,
    the override arrives and is named."""
    script = tmp_path / "overrides.sbatch"
    script.write_text("\n".join(["#!/bin/bash", "set -eo pipefail", *shellfile.lines("overrides.sh"), "env"]) + "\n")
    out = {}
    for name, extra in (("none", []), ("all", ["--export=ALL"])):
        job = slurm_cluster.run(
            "sbatch",
            "--parsable",
            "-N1",
            f"--output={tmp_path}/{name}.out",
            *extra,
            str(script),
            env={**EXPORT_NONE, "HPCTRAIN_CONFIG": "configs/mine.yaml"},
            cwd=tmp_path,
        ).stdout.strip()
        assert slurm_cluster.wait_done(job, 120) == "COMPLETED", (tmp_path / f"{name}.out").read_text()
        out[name] = (tmp_path / f"{name}.out").read_text()
    assert "\nSLURM_EXPORT_ENV=NONE\n" in out["none"] and "\nHPCTRAIN_CONFIG=" not in out["none"], out["none"]
    assert "hpctrain: overrides from the environment: none (the defaults below run)" in out["none"]
    assert "submitted with --export=NONE" in out["none"] and "sbatch --export=ALL" in out["none"]
    said = "hpctrain: overrides from the environment: HPCTRAIN_CONFIG=configs/mine.yaml"
    assert said in out["all"] and "--export=NONE" not in out["all"], out["all"]


def test_srun_export_env_none_still_gives_the_tasks_the_shells_environment(slurm_cluster, digits_root, tmp_path):
    """SRUN_EXPORT_ENV=NONE at submission (a site's or a profile's setting): srun reads it over the
    script's SLURM_EXPORT_ENV=ALL (srun(1): "will override any setting for SLURM_EXPORT_ENV"), and the
    tasks would get only SLURM_* (no SUBMITIT_*: the job fails). The batch shell replaces it, says so,
    and the tasks get its environment, with the submitting shell's variables."""
    job = submit(
        slurm_cluster,
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        *digits_sets(digits_root, tmp_path, "srunnone", *SHORT, "train.max_steps=4"),
        env={"SRUN_EXPORT_ENV": "NONE", "HPCTRAIN_LOGIN_SHELL_MARK": "set at submission"},
    )
    run = tmp_path / "srunnone"
    assert slurm_cluster.wait_done(job, 240) == "COMPLETED", job_report(slurm_cluster, job, run)
    env = json.loads((run / "env.json").read_text())["env"]
    assert env["HPCTRAIN_LOGIN_SHELL_MARK"] == "set at submission"  # the shell's environment reached the tasks
    said = "".join(p.read_text() for p in (run / "submitit").glob(f"{job}_*_log.*"))
    assert "SRUN_EXPORT_ENV=NONE (a site or profile setting)" in said, said[-2000:]


def test_submission_from_inside_an_allocation_runs_with_its_own_resources(slurm_cluster, digits_root, tmp_path):
    """`hpctrain submit` run inside a plain batch job (a job chaining the next) on a site with
    DefMemPerCPU: the enclosing job has SLURM_MEM_PER_CPU from the site default, sbatch would copy it
    into the new job, whose srun then refuses to start beside the job's own SLURM_MEM_PER_NODE (--mem,
    as sites set slurm.mem_per_node) as "mutually exclusive"; the submission leaves the enclosing job's
    settings out."""
    cmd = [
        sys.executable,
        "-m",
        "hpctrain",
        "submit",
        "--config",
        "configs/digits_vit.yaml",
        "--cluster",
        "local",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--cluster-set",
        "slurm.mem_per_node=500M",
        *digits_sets(digits_root, tmp_path, "inner", *SHORT, "train.max_steps=4"),
    ]
    out, err = tmp_path / "outer.out", tmp_path / "outer.err"
    with slurm_cluster.reconfigured(**DEF_MEM_PER_CPU):
        outer = slurm_cluster.run(
            "sbatch",
            "--parsable",
            "-N1",
            "-n1",
            f"--chdir={ROOT}",
            f"--output={out}",
            f"--error={err}",
            "--wrap",
            f"env | grep '^SLURM_MEM_' >&2; {shlex.join(cmd)}",
            env={"OMP_NUM_THREADS": "1"},
        ).stdout.strip()
        assert slurm_cluster.wait_done(outer, 120) == "COMPLETED", err.read_text()
    assert "SLURM_MEM_PER_CPU=100" in err.read_text(), err.read_text()  # the site default reached the job
    job = out.read_text().split("submitted Slurm job ")[1].split()[0]
    assert slurm_cluster.wait_done(job, 240) == "COMPLETED", sacct_states(slurm_cluster, job)
    (left_out,) = [line for line in err.read_text().splitlines() if "stay out of the new job" in line]
    assert "SLURM_MEM_PER_CPU" in left_out and "kept: SLURM_CONF" in left_out, left_out
    assert metrics(tmp_path / "inner", "end")[-1]["status"] == "finished"


def test_preempt_send_user_signal_site_counts_a_preemption(each_slurm_cluster, digits_root, tmp_path):
    """SlurmctldParameters=preempt_send_user_signal (22.05; 24.11: PreemptParameters=send_user_signal):
    a preempted job gets its --signal (USR2), as at a time limit, not SIGTERM. The batch shell sees
    PreemptTime set and the stop is recorded as a preemption: slurm.max_requeues stays untouched.
    The job is requeued once: by the batch shell on 22.05, by Slurm itself on 24.11 (as on SIGTERM)."""
    slurm_cluster = each_slurm_cluster
    run = tmp_path / "usig"
    shape = slurm_cluster.send_user_signal()
    with slurm_cluster.reconfigured(**shape):
        assert "send_user_signal" in slurm_cluster.run("scontrol", "show", "config").stdout
        job = submit(
            slurm_cluster,
            "--nodes",
            "2",
            "--gpus-per-node",
            "1",
            "--partition",
            PREEMPTIBLE,
            *digits_sets(digits_root, tmp_path, "usig", *SHORT, "train.max_steps=200"),
        )
        training(slurm_cluster, job, run)
        urgent = slurm_cluster.run(
            "sbatch",
            "--parsable",
            f"--partition={URGENT}",
            "-N2",
            "--exclusive",
            f"--output={tmp_path}/urgent-%j.out",
            "--wrap",
            "sleep 2",
        ).stdout.strip()
        assert slurm_cluster.wait_done(urgent, 120) == "COMPLETED"
    assert slurm_cluster.wait_done(job, 240) == "COMPLETED", sacct_states(slurm_cluster, job)
    first = "PREEMPTED" if "24.11" in slurm_cluster.version() else "REQUEUED"
    assert sacct_states(slurm_cluster, job) == [first, "COMPLETED"]
    (stop,) = metrics(run, "stop")
    (req,) = metrics(run, "requeue")
    assert stop["stop_kind"] == req["reason"] == "preemption" and req["requeue"], (stop, req)
    st = hp(slurm_cluster, "status", job).stdout
    assert "requeues       1 (1 after preemption, 0 after a time limit" in st, st
    # the shape applied: the stop came as USR2 with PreemptTime set (not SIGTERM); who requeued
    shell = "".join(p.read_text() for p in (run / "submitit").glob(f"{job}_*_log.*"))
    assert "received SIGUSR2" in shell and "for a preemption (PreemptTime set)" in shell, shell
    assert ("requeues the job itself as this shell ends" in shell) == ("24.11" in slurm_cluster.version()), shell

"""Hot spare nodes and bad-node exclusion (docs/spares.md): the batch shell's step loop
(launch.inplace), its records (hpctrain.run.faultlog) and `hpctrain status`.

On the Slurm test cluster (a training node that dies and its spare: tests/faults/test_campaign.py): a
fault that names a node without spares (the hang watchdog's silent rank, whose GPU then fails the probe step):
the job is requeued with that node in its ExcNodeList and finishes elsewhere; the same silent rank
on a node that passes its probe restarts in place.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from hpctrain import shellfile
from hpctrain.config import Config
from hpctrain.launch.sbatch import sbatch_lines
from hpctrain.launch.submit import LaunchError, Request, plan_job, slurm_script
from hpctrain.run import faultlog
from hpctrain.run.metrics import MetricsWriter, read_metrics
from hpctrain.run.source import take_snapshot
from hpctrain.site.profile import load_profile
from hpctrain.watch.render import status_text
from hpctrain.watch.summary import run_status, summarize
from tests.helpers import ROOT
from tests.launch.jobs import (
    JOB_SETS,
    JOB_STEPS,
    digits_sets,
    hp,
    metrics,
    rank_hosts,
    sacct_states,
    submit,
    task_pid,
    wait_for_step,
)
from tests.slurm_cluster import SPARE_PARTITION

STEPS = JOB_STEPS
SETS = (*JOB_SETS, "ckpt.every=5")


def test_spare_nodes_are_allocated_with_no_kill_and_the_shell_parses(tmp_path):
    prof = load_profile("local")
    cfg = Config()
    plain = plan_job(cfg, prof, Request(nodes=2, gpus_per_node=1))
    assert "#SBATCH --nodes=2" in sbatch_lines(plain) and "#SBATCH --no-kill" not in sbatch_lines(plain)
    spared = plan_job(cfg, prof, Request(nodes=2, gpus_per_node=1, spare_nodes=1))
    assert "#SBATCH --nodes=3" in sbatch_lines(spared) and "#SBATCH --no-kill" in sbatch_lines(spared)
    by_profile = dataclasses.replace(prof, slurm=dataclasses.replace(prof.slurm, spare_nodes=2))
    assert plan_job(cfg, by_profile, Request(nodes=2, gpus_per_node=1)).spare_nodes == 2
    with pytest.raises(LaunchError, match=r"--spare-nodes=-1: use 0"):
        plan_job(cfg, prof, Request(nodes=2, gpus_per_node=1, spare_nodes=-1))
    script = slurm_script(spared, tmp_path / "submitit")
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert "hpctrain_spares=${HPCTRAIN_SPARE_NODES-1}" in script
    assert 'export HPCTRAIN_BAD_NODES_FILE="$HPCTRAIN_CONTROL_DIR/bad-nodes-${SLURM_JOB_ID:-none}"' in script


def test_the_shell_refuses_a_spare_count_that_is_not_a_number(tmp_path):
    """HPCTRAIN_SPARE_NODES reaches shell arithmetic: anything but digits is refused first (an
    arithmetic expansion would run `$(...)` inside it)."""
    plan = plan_job(Config(), load_profile("local"), Request(nodes=1, gpus_per_node=1, spare_nodes=1))
    script = slurm_script(plan, tmp_path / "submitit", snap=take_snapshot(tmp_path))  # the script fixes its path
    setup = script[: script.index("\nhpctrain_step_loop ")]  # everything before the steps (their first srun)
    env = {**os.environ, "HPCTRAIN_SPARE_NODES": "a[$(touch PWNED)]", "SLURM_JOB_NUM_NODES": "2"}
    r = subprocess.run(["bash", "-c", setup], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 1 and "must be whole numbers" in r.stderr, r.stderr
    assert not (tmp_path / "PWNED").exists()
    env["HPCTRAIN_SPARE_NODES"] = "2"
    r = subprocess.run(["bash", "-c", setup], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 1 and "leave none of the job's 2 to train on" in r.stderr, r.stderr


def budget_left(control: Path, restarts: int, max_requeues: int) -> subprocess.CompletedProcess:
    """The batch shell's hpctrain_budget_left (stops.sh), run by bash as the script defines it."""
    prog = shellfile.program(["stops.sh"]) + 'hpctrain_budget_left || { echo "$hpctrain_budget_why"; exit 1; }'
    env = {
        **os.environ,
        "SLURM_JOB_ID": "77",
        "SLURM_RESTART_COUNT": str(restarts),
        "HPCTRAIN_MAX_REQUEUES": str(max_requeues),
    }
    return subprocess.run(["bash", "-c", prog], capture_output=True, text=True, cwd=control, env=env)


def test_the_shells_own_requeues_count_against_max_requeues_and_preemptions_do_not(tmp_path):
    """A requeue the batch shell decides itself (nodes named and too few left, the guard's) is
    refused once the job's restarts that were not preemptions reach slurm.max_requeues, as rank 0
    refuses a time-limit requeue (run/requeue.py). Before, such requeues were never counted: a job
    could loop start → refused by its budget → a node named → requeued."""
    assert budget_left(tmp_path, 2, 3).returncode == 0
    r = budget_left(tmp_path, 3, 3)
    assert r.returncode == 1 and "requeued 3 time(s) already" in r.stdout and "max_requeues=3" in r.stdout, r
    (tmp_path / ".hpctrain" / "preempted-77").write_text("0\n2\n")  # two preemptions, at restarts 0 and 2
    assert budget_left(tmp_path, 3, 3).returncode == 0  # 1 of the 3 restarts was not a preemption
    assert budget_left(tmp_path, 5, 3).returncode == 1


def test_fault_lines_become_records_once_and_status_shows_them(tmp_path):
    faults = tmp_path / "faults-77"
    faults.write_text(
        "100\t0\t1\trestart\tn2\tn2: left the job's allocation (Slurm: node failure)\t99\n"
        "garbage line\n"
        "200\t0\t1\trequeue\tn3,bad name\tn3: no answer to a probe step\t199\n"
        "300.1234567\t0\t2\trestart\t\texit 137: a rank was killed\t299.5\n"  # hpctrain_now's microseconds
        "301.\t0\t3\trestart\t\texit 137\t300\n"
    )
    env = {"HPCTRAIN_FAULTS_FILE": str(faults), "SLURM_JOB_ID": "77"}
    m = MetricsWriter(tmp_path / "metrics.jsonl")
    new = faultlog.record_new(m, [], env)
    assert [(r["kind"], r["nodes"], r["attempt"]) for r in new] == [
        ("restart", ["n2"], 1),
        ("exclude", ["n3"], 1),
        ("restart", [], 2),
    ]
    assert (new[0]["decided_at"], new[0]["step_ended_at"]) == (100, 99)
    assert (new[2]["decided_at"], new[2]["step_ended_at"]) == (300.123, 299.5)
    recs = read_metrics(tmp_path / "metrics.jsonl")
    assert faultlog.record_new(m, recs, env) == []  # a later attempt records nothing twice
    s = summarize(read_metrics(tmp_path / "metrics.jsonl"))
    assert not s["last_restart"].get("fewer_nodes")
    assert s["restarts"] == 2 and s["excluded"] == {
        "n2": "left the job's allocation (Slurm: node failure)",
        "n3": "no answer to a probe step",
    }


FAKE_GPU = ROOT / "tests" / "launch" / "fake_gpu"


def gpu_probe_env(lost: Path) -> dict:
    """The job's probe steps check 1 GPU per node with tests/launch/fake_gpu/nvidia-smi, which lists
    none on the nodes named in the file `lost`."""
    return {
        "PATH": f"{FAKE_GPU}:{os.environ['PATH']}",
        "HPCTRAIN_PROBE_GPUS": "1",
        "HPCTRAIN_TEST_LOST_GPUS": str(lost),
    }


def submit_silent_rank_job(
    cluster, digits_root, tmp_path, name: str, lost: Path, *extra: str, env: dict | None = None
) -> str:
    """A 2-node job without spares whose hang watchdog fires 5 s after a rank stops, with GPU probes
    (`gpu_probe_env(lost)`, no GPU lost yet), once it has trained 7 steps; `extra`: more submit options,
    `env`: more of the submitting environment."""
    lost.write_text("")
    job = submit(
        cluster,
        *extra,
        "--partition",
        SPARE_PARTITION,
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        *digits_sets(
            digits_root,
            tmp_path,
            name,
            *SETS,
            "health.hang_timeout_s=5",
            "dist.pg_timeout_s=30",
        ),
        env={"HPCTRAIN_TEST_DELAY": "0:0.3:data", **gpu_probe_env(lost), **(env or {})},
    )
    wait_for_step(tmp_path / name, 7, 180)
    return job


def sacct_all(cluster, job: str) -> list[tuple[str, str]]:
    """(JobID, State) of the allocation's rows and every step, every run of the job."""
    r = cluster.run("sacct", "-n", "-P", "-D", "-j", job, "-o", "JobID,State", check=False)
    return [tuple(line.split("|")[:2]) for line in r.stdout.splitlines() if line.strip()]


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.slurm
def test_spares_refused_on_a_slurm_older_than_22_05(slurm_cluster, digits_root, tmp_path):
    """A login node whose Slurm is 21.08 (an `sbatch` first on PATH that answers `--version` as 21.08.8
    does and hands anything else to the real one): spares are refused in one line; the real one passes."""
    real = shutil.which("sbatch", path=slurm_cluster.environ()["PATH"])
    old = tmp_path / "slurm2108"
    old.mkdir()
    (old / "sbatch").write_text(
        f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "slurm 21.08.8"; exit 0; }}\nexec {real} "$@"\n'
    )
    (old / "sbatch").chmod(0o755)
    args = ["--config", "configs/digits_vit.yaml", "--nodes", "2", "--gpus-per-node", "1", "--spare-nodes", "1"]
    args += [*digits_sets(digits_root, tmp_path, "spares"), "--dry-run"]
    env = {"PATH": f"{old}{os.pathsep}{slurm_cluster.environ()['PATH']}"}
    r = hp(slurm_cluster, "submit", *args, env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and not r.stdout, r.stdout + r.stderr
    assert "spare nodes need Slurm 22.05 or newer" in r.stderr and "'slurm 21.08.8'" in r.stderr, r.stderr
    assert "--spare-nodes 0" in r.stderr, r.stderr
    ok = hp(slurm_cluster, "submit", *args)  # the test cluster's own Slurm (22.05 or 24.11)
    assert ok.returncode == 0 and "#SBATCH --no-kill" in ok.stdout, ok.stdout + ok.stderr


def test_a_silent_rank_on_a_node_whose_gpu_fails_its_probe_goes_to_exc_node_list(slurm_cluster, digits_root, tmp_path):
    """No spares: rank 1 stops (the hang watchdog names its node as a suspect in
    $HPCTRAIN_BAD_NODES_FILE) and its node's GPU drops off the bus (a fake nvidia-smi lists none
    there); the probe confirms the node faulty, and the batch shell requeues the job with that node
    excluded (ExcNodeList); the job finishes on the other nodes of the partition. The site's
    slurm.report_bad_node command and file hear of the node, its evidence and the job (docs/sites.md).
    The batch shell's call log ($HPCTRAIN_SLURM_CALL_LOG, ctld.sh) shows ONE probe step over both nodes
    (before: one srun per node)."""
    run, lost = tmp_path / "silent", tmp_path / "lost-gpus"
    report, admin_log = tmp_path / "report-node", tmp_path / "admin" / "bad-nodes.log"
    report.write_text(f"#!/bin/bash\nprintf '%s\\0' \"$@\" >> {tmp_path}/report-args\n")
    report.chmod(0o755)
    admin_log.parent.mkdir()
    admin_log.touch(mode=0o666)
    admin_log.chmod(0o666)  # the admins' file: appendable by the users
    reporting = (
        f"--cluster-set=slurm.report_bad_node.command=[{report}]",
        f"--cluster-set=slurm.report_bad_node.file={admin_log}",
    )
    log = tmp_path / "slurm-calls.jsonl"
    env = {"HPCTRAIN_SLURM_CALL_LOG": str(log)}
    job = submit_silent_rank_job(slurm_cluster, digits_root, tmp_path, "silent", lost, *reporting, env=env)
    victim = rank_hosts(run)[1][1]
    pid = task_pid(job, 1)
    assert pid
    lost.write_text(f"{victim}\n")  # its GPU is gone (an Xid): the probe's nvidia-smi -L lists none
    os.kill(pid, signal.SIGSTOP)  # rank 1 goes silent: no step, no stack
    assert slurm_cluster.wait_done(job, 300) == "COMPLETED", sacct_all(slurm_cluster, job)
    assert sacct_states(slurm_cluster, job) == ["REQUEUED", "COMPLETED"]
    show = slurm_cluster.run("scontrol", "show", "job", "-o", job).stdout
    exc = re.search(r"\bExcNodeList=(\S+)", show).group(1)
    nodes = re.search(r"\bNodeList=(\S+)", show).group(1)
    assert victim in slurm_cluster.run("scontrol", "show", "hostnames", exc).stdout.split(), show
    assert victim not in slurm_cluster.run("scontrol", "show", "hostnames", nodes).stdout.split(), show
    (exclude,) = metrics(run, "exclude")
    assert exclude["nodes"] == [victim] and "nvidia-smi -L lists 0 of the 1 GPU(s)" in exclude["why"], exclude
    assert "also: rank 1 silent" in exclude["why"], exclude  # the watchdog's suspicion, confirmed
    # the hang record (step 7) went to metrics.superseded.jsonl when the requeued run resumed at step 5
    hangs = [r for r in read_metrics(run / "metrics.superseded.jsonl") if r["kind"] == "hang"]
    assert hangs and hangs[-1]["ranks"] == [1] and metrics(run, "end")[-1]["status"] == "finished"
    st = hp(slurm_cluster, "status", job).stdout
    assert re.search(rf"excluded +{victim} \(probe step failed \(exit 2\): nvidia-smi -L lists 0", st), st
    node, evidence, job_id = (tmp_path / "report-args").read_text().split("\0")[:-1]
    assert (node, job_id) == (victim, job) and "nvidia-smi -L lists 0 of the 1 GPU(s)" in evidence, evidence
    (line,) = admin_log.read_text().splitlines()
    assert line.split("\t")[1:3] == [job, victim] and line.split("\t")[4] == evidence, line
    batch = [c for c in map(json.loads, log.read_text().splitlines()) if c["where"] == "batch"]
    probes = [c for c in batch if c["kind"] == "srun" and "hpctrain-probe" in c["args"]]
    assert len(probes) == 1 and {"--nodes=2", "--ntasks-per-node=1"} <= set(probes[0]["args"]), probes
    steps = [c for c in batch if c["kind"] == "srun" and "--kill-on-bad-exit=1" in c["args"]]
    assert len(steps) == 2 and all(c["rc"] is None for c in steps), steps  # the training step of each attempt


@pytest.mark.slurm
@pytest.mark.slow
def test_a_silent_rank_on_a_healthy_node_restarts_in_place(slurm_cluster, digits_root, tmp_path):
    """No spares: rank 1 stops (SIGSTOP) and the hang watchdog names its node as a suspect, but the
    node passes its probe (its GPU is listed, it runs a task, the run directory takes a write): the
    process was at fault, not the node. No node is excluded: the step restarts on the same nodes from
    the last checkpoint (before, the node went to ExcNodeList and the job was requeued)."""
    run, lost = tmp_path / "stopped", tmp_path / "lost-gpus"
    job = submit_silent_rank_job(slurm_cluster, digits_root, tmp_path, "stopped", lost)
    pid = task_pid(job, 1)
    assert pid
    os.kill(pid, signal.SIGSTOP)
    assert slurm_cluster.wait_done(job, 400) == "COMPLETED", sacct_all(slurm_cluster, job)
    assert sacct_states(slurm_cluster, job) == ["COMPLETED"]  # never requeued
    assert metrics(run, "exclude") == []
    (restart,) = metrics(run, "restart")
    assert restart["nodes"] == [] and restart["attempt"] == 1, restart
    show = slurm_cluster.run("scontrol", "show", "job", "-o", job).stdout
    assert re.search(r"\bExcNodeList=\(null\)", show), show


def test_a_shrink_line_is_a_restart_on_fewer_nodes_and_status_says_so(tmp_path):
    """A node range with no spare free goes on with the nodes left (step_next.sh): the fault file's
    action `shrink` is a `restart` record with `fewer_nodes`; with rank 0's `resize` record, status
    says both."""
    faults = tmp_path / "faults-77"
    faults.write_text("100\t0\t1\tshrink\tn3\tn3: left the job's allocation; no spare free: going on with 2 of 3\t99\n")
    env = {"HPCTRAIN_FAULTS_FILE": str(faults), "SLURM_JOB_ID": "77"}
    m = MetricsWriter(tmp_path / "metrics.jsonl")
    (rec,) = faultlog.record_new(m, [], env)
    assert rec["kind"] == "restart" and rec["fewer_nodes"] and rec["nodes"] == ["n3"], rec
    m.write(
        "resize",
        step=20,
        nodes_before=3,
        nodes=2,
        world_size_before=6,
        world_size=4,
        accum_steps_before=1,
        accum_steps=1,
        job="77",
        why=rec["why"],
    )
    (tmp_path / "job.json").write_text(json.dumps({"job_id": "77", "executor": "slurm"}))
    st = run_status(str(tmp_path), now=200)
    text = status_text(st)
    assert re.search(r"restarts +1 in the job on fewer nodes \(last: attempt 1 of job 77 without n3: n3: left", text), (
        text
    )
    assert re.search(
        r"resized +1 time\(s\) \(last, at step 20: 3 → 2 nodes \(world 6 → 4, accumulation 1 → 1\): n3:", text
    ), text
    assert st.facts()["resizes"] == 1 and st.facts()["last_resize"]["world_size"] == 4

"""Where the training tasks run on a node (launch.submit.cpus_per_task, launch.sbatch.binding): each
task asks its GPU's share of the node's CPUs (--cpus-per-task), is bound to cores of its own
(--cpu-bind=cores) and sees every GPU of its node (--gpu-bind=none); checked in the rendered script."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from hpctrain import shellfile
from hpctrain.config import load
from hpctrain.launch.sbatch import STEP_SRUN
from hpctrain.launch.submit import Request, plan_job, slurm_script
from hpctrain.site.profile import load_profile
from tests.helpers import ROOT
from tests.launch.jobs import digits_sets, job_report, submit
from tests.slurm_cluster import GPU_PARTITION

CFG = ROOT / "configs" / "vit_b16_imagenet.yaml"


def script(tmp_path: Path, profile: str, *sets: str, gpus: int | None = None, nodes: int = 2) -> str:
    cfg = load(CFG, [f"run.dir={tmp_path}", "data.global_batch=64"])
    plan = plan_job(cfg, load_profile(profile, sets), Request(nodes=nodes, gpus_per_node=gpus))
    text = slurm_script(plan, tmp_path / "submitit")
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    return text


def training_srun(text: str) -> str:
    """The training step's srun as step_loop.sh runs it: its options, this job's binding (the array the
    main lines set), then the tasks' command (the loop's arguments); the per-step arrays left out."""
    (bind,) = [ln for ln in text.splitlines() if ln.startswith("hpctrain_step_bind=(")]
    (call,) = [ln for ln in text.splitlines() if ln.startswith("hpctrain_step_loop ")]
    words = shlex.split(bind.removeprefix("hpctrain_step_bind=(").removesuffix(")"))
    return " ".join([STEP_SRUN, *map(shlex.quote, words), call.removeprefix("hpctrain_step_loop ")])


def sbatch_option(text: str, key: str) -> str | None:
    m = re.search(rf"(?m)^#SBATCH --{key}(?:=(\S*))?$", text)
    return None if m is None else (m.group(1) or "")


def test_each_task_asks_its_gpus_share_of_the_nodes_cpus_and_is_bound_to_cores(tmp_path):
    text = script(tmp_path, "example-ib")  # 96 CPUs, 8 GPUs a node
    assert sbatch_option(text, "cpus-per-task") == "12"
    srun = training_srun(text)
    assert srun.startswith("srun --kill-on-bad-exit=1 --unbuffered --open-mode=append --cpu-bind=cores --gpu-bind=none")


def test_a_job_on_half_a_nodes_gpus_asks_half_its_cpus_not_all_of_them(tmp_path):
    """Before: cpus_per_node // --gpus-per-node, 24 per task for 4 GPUs: every CPU of a node whose
    other 4 GPUs another job then cannot feed."""
    text = script(tmp_path, "example-ib", gpus=4)
    assert (sbatch_option(text, "gpus-per-node"), sbatch_option(text, "cpus-per-task")) == ("4", "12")


def test_cpu_only_nodes_share_their_cpus_among_the_tasks(tmp_path):
    text = script(tmp_path, "local", "slurm.cpus_per_node=8", gpus=2)
    assert sbatch_option(text, "cpus-per-task") == "4" and sbatch_option(text, "gpus-per-node") is None
    srun = training_srun(text)
    assert "--cpu-bind=cores" in srun and "--gpu-bind" not in srun  # no GPUs requested, none to bind


def test_without_a_cpu_count_slurm_decides_and_the_sites_binding_stays(tmp_path):
    """cpus_per_node 0 (the local profile): no --cpus-per-task, so a task has Slurm's default (one
    CPU); binding it to cores would pin a whole-node job's tasks to one core each."""
    text = script(tmp_path, "local", gpus=2)
    assert sbatch_option(text, "cpus-per-task") is None
    assert "--cpu-bind" not in training_srun(text)


def test_cpu_bind_empty_leaves_the_sites_binding(tmp_path):
    srun = training_srun(script(tmp_path, "example-ib", 'slurm.cpu_bind=""'))
    assert "--cpu-bind" not in srun and "--gpu-bind=none" in srun


def test_cpu_bind_takes_only_srun_binding_types(tmp_path):
    with pytest.raises(Exception, match="slurm.cpu_bind"):
        load_profile("example-ib", ["slurm.cpu_bind=map_cpu:0,1;touch x"])


def test_the_batch_shell_hands_the_cpus_per_task_to_srun_on_every_release(tmp_path):
    """srun 22.05–23.02 takes --cpus-per-task from SRUN_CPUS_PER_TASK only (srun(1) 22.05: "not
    automatically inherited by srun"); 23.11+ reads SLURM_CPUS_PER_TASK: the script's srun_env.sh
    sets the first from the second (sbatch sets it from --cpus-per-task), so each task gets its share."""
    text = script(tmp_path, "example-ib")
    assert SRUN_ENV.strip() in text
    out = subprocess.run(
        ["bash", "-c", SRUN_ENV + 'echo "$SRUN_CPUS_PER_TASK"'],
        env={"SLURM_CPUS_PER_TASK": "12", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert out.stdout.strip() == "12", out.stderr


SRUN_ENV = "\n".join(shellfile.lines("srun_env.sh")) + "\n"  # as the renderer puts it in the script


def test_a_gpu_job_with_its_binding_runs_on_slurm_22_05_and_its_workers_come_from_its_cpus(
    slurm_cluster, digits_root, tmp_path
):
    """The test cluster's GPU node (2 GPUs as a GRES, 4 CPUs, task/none): srun takes --cpu-bind=cores
    and --gpu-bind=none there, each task asks 4 / 2 = 2 CPUs, and data.workers=auto makes 1 worker."""
    sets = digits_sets(digits_root, tmp_path, "bound", "train.max_steps=2", "train.eval_every_epochs=0")
    job = submit(
        slurm_cluster,
        "--cluster",
        "local",
        *("--cluster-set", "slurm.request_gpus=true", "--cluster-set", "slurm.max_gpus_per_node=2"),
        *("--cluster-set", "slurm.cpus_per_node=4", "--partition", GPU_PARTITION),
        *("--nodes", "1", "--gpus-per-node", "2", "--set", "data.workers=auto"),
        *sets,
    )
    run = tmp_path / "bound"
    assert slurm_cluster.wait_done(job, 300) == "COMPLETED", job_report(slurm_cluster, job, run)
    script = slurm_cluster.run("scontrol", "write", "batch_script", job, "-").stdout
    assert "#SBATCH --cpus-per-task=2" in script and "--cpu-bind=cores --gpu-bind=none" in training_srun(script)
    log = (run / "logs" / "rank-0.log").read_text()
    assert "loader workers: data.workers=auto: 1 per rank (2 CPUs for the task: SLURM_CPUS_PER_TASK=2" in log, log

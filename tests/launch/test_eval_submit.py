"""`hpctrain eval --nodes`: the evaluation as a job through `hpctrain submit`'s path (submitit's
local executor here; the batch script of a Slurm job). No Slurm-cluster job: the Slurm side is
the training job's script and submitter, tested in test_sbatch.py / test_slurm_jobs.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hpctrain.run.source import source_hash
from tests.helpers import DIGITS, digits_args, run_metrics, run_ranks
from tests.launch.test_sbatch import BLOCKED, blocked_cli

# 20 steps of a 1-block ViT: little accuracy (~13 %), but its loss (2.2925) is far from the zero-initialised
# head's ln 10 = 2.3026, so the trained weights are what the job evaluates
TINY = [
    "model.depth=1",
    "model.width=32",
    "model.heads=2",
    "train.max_steps=20",
    "optim.lr=3e-3",
    "optim.warmup_epochs=0",
]


@pytest.fixture(scope="module")
def tiny_run(digits_root, tmp_path_factory):
    """A finished tiny digits run with its final eval record."""
    d = tmp_path_factory.mktemp("evalsubmit")
    run_ranks(1, digits_args(digits_root, d, "tiny", *TINY))
    return d / "tiny"


def no_slurm(tmp_path) -> dict:
    """The environment of a machine without Slurm: no profile named, no controller configured (an
    empty slurm.conf: `scontrol ping` fails at once; a missing one retries for 60 s)."""
    conf = tmp_path / "empty-slurm.conf"
    conf.write_text("")
    env = {k: v for k, v in os.environ.items() if k != "HPCTRAIN_CLUSTER"}
    return {**env, "SLURM_CONF": str(conf), "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_local_job_on_2_processes_equals_the_runs_last_eval(tiny_run, tmp_path):
    last = run_metrics(tiny_run, "eval")[-1]
    out = tmp_path / "ev"
    # the submitting process as on a login node (torch blocked); the job's processes import it
    r = subprocess.run(
        [sys.executable, "-c", BLOCKED, "eval", str(tiny_run), "--nodes", "1", "--local-tasks", "2", "-o", str(out)],
        capture_output=True,
        text=True,
        env=no_slurm(tmp_path),
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "submitted local job" in r.stdout and f"{out / 'summary.json'}" in r.stdout
    s = json.loads((out / "summary.json").read_text())
    assert (s["top1"], s["top5"], s["count"]) == (last["top1"], last["top5"], last["count"])
    assert abs(s["loss"] - last["loss"]) < 1e-6 and abs(last["loss"] - 2.302585) > 1e-3  # 2 ranks: other batches
    assert s["world_size"] == 2 and s["weights"] == str(tiny_run.resolve())
    assert (out / "per_class.csv").is_file() and f"{s['top1']:.4f} %" in r.stdout  # the summary table
    assert not (tiny_run / "eval").exists()  # -o honoured; the run's own job.json untouched


def test_bad_combinations_fail_in_one_line(tmp_path, monkeypatch, capsys):
    from hpctrain.cli import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(DIGITS.read_text())
    for k, v in no_slurm(tmp_path).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("HPCTRAIN_CLUSTER", raising=False)
    for args, msg in (
        ([str(run), "--nodes", "2"], "--nodes=2: the job runs on this machine (--local, or no Slurm here)"),
        ([str(run), "--local-tasks", "2"], "--local-tasks is for a job: add --nodes N"),
        ([str(run), "--cluster", "example-ib"], "--cluster is for a job: add --nodes N"),
        ([str(run), "--nodes", "1", "--dry-run", "--wait"], "--dry-run submits nothing"),
        ([str(run / "none"), "--config", str(DIGITS), "--nodes", "1"], "none does not exist"),
        (["--weights", str(run), "--nodes", "2"], "--weights needs --config"),
    ):
        assert main(["eval", *args]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and msg in err, err


def test_slurm_script_is_the_training_jobs_with_eval_task(tmp_path):
    """--dry-run without torch: the same container, module, NCCL and stop lines as `hpctrain submit`'s;
    only the job's name, folders and binds differ."""
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"")
    common = [
        "--config",
        str(DIGITS),
        "--nodes",
        "2",
        "--gpus-per-node",
        "4",
        "--cluster",
        "example-ib",
        "--dry-run=full",
    ]
    ev = blocked_cli("eval", "--weights", str(weights), "-o", str(tmp_path / "ev"), *common, cwd=tmp_path)
    tr = blocked_cli("submit", *common, cwd=tmp_path)
    assert ev.returncode == 0 and tr.returncode == 0, ev.stderr + tr.stderr
    assert f"# hpctrain eval: hpctrain.launch.task.eval_task of {weights}" in ev.stdout
    step = next(ln for ln in ev.stdout.splitlines() if "-m hpctrain.launch.task" in ln)
    assert step.startswith("hpctrain_step_loop "), step  # the training's steps (step_loop.sh)
    assert step.endswith(f"-m hpctrain.launch.task {tmp_path / 'ev' / 'submitit'}"), step
    assert "#SBATCH --nodes=2" in ev.stdout and "#SBATCH --ntasks-per-node=4" in ev.stdout
    assert f"--bind {weights} --bind {tmp_path / 'ev'}" in ev.stdout
    run_dir = str(tmp_path / "runs" / "digits_vit")
    differ = (
        "# hpctrain eval",
        "# outputs:",
        "#SBATCH --job-name",
        "#SBATCH --output",
        "#SBATCH --chdir",
        "  hpctrain_exec=(",  # the binds (the weights, the eval directory)
        "  hpctrain_mounts=",
        "srun ",
        "  srun ",
        "hpctrain_step_loop ",  # the steps: their output and task module differ
        "HPCTRAIN_SOURCE=",
    )
    same = lambda s: [ln for ln in s.splitlines() if not ln.startswith(differ)]
    assert same(ev.stdout) == same(tr.stdout)
    code = f"code/{source_hash()}/hpctrain\n"  # each job's code snapshot in its own directory
    assert f"\nHPCTRAIN_SOURCE={tmp_path / 'ev'}/{code}" in ev.stdout
    assert f"\nHPCTRAIN_SOURCE={run_dir}/{code}" in tr.stdout
    for line in (
        "module load $hpctrain_modules",
        "export TORCH_NCCL_ASYNC_ERROR_HANDLING=",
        "apptainer exec --nv --cleanenv",
        "trap 'hpctrain_pass TERM' TERM",
    ):
        assert line in ev.stdout, line
    assert run_dir not in ev.stdout and run_dir in tr.stdout

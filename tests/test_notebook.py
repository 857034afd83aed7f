"""`hpctrain notebook`: the batch script and tunnel command it prints, and its errors."""

from __future__ import annotations

import subprocess

import pytest

from hpctrain.cli import main
from hpctrain.notebook import NotebookError, NotebookJob, batch_script, submit, tunnel_command


def test_dry_run_prints_script_and_tunnel(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = main(
        [
            "notebook",
            "--nodes",
            "1",
            "--dry-run",
            "--image",
            "/scratch/me/ngc.sif",
            "--partition",
            "gpu",
            "--setup",
            "module load apptainer",
            "--login-host",
            "login.example.org",
            "--port",
            "23456",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    script, _, tail = out.partition("# on your laptop")
    assert script.splitlines() == [
        "#!/bin/bash -l",
        "#SBATCH --job-name=hpctrain-notebook",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --time=04:00:00",
        f"#SBATCH --output={tmp_path}/notebook-%j.log",
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --partition=gpu",
        "set -euo pipefail",
        "module load apptainer",
        f"cd {tmp_path}",
        'echo "hpctrain-notebook: node $(hostname -s) port 23456"',
        "export PYTHONNOUSERSITE=1",
        "exec apptainer exec --nv /scratch/me/ngc.sif jupyter lab --no-browser --ip=127.0.0.1 --port=23456 "
        f"--ServerApp.root_dir={tmp_path}",
    ]
    assert tail.splitlines()[1] == "ssh -N -J login.example.org -L 23456:127.0.0.1:23456 <node>"
    (tmp_path / "nb.sh").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "nb.sh")]).returncode == 0


def test_without_image_and_quoting(tmp_path):
    job = NotebookJob(gpus_per_node=0, workdir=str(tmp_path / "my notebooks"), port=30000, mem="64G")
    s = batch_script(job)
    assert "--gpus-per-node" not in s and "#SBATCH --mem=64G" in s
    assert f"cd '{tmp_path}/my notebooks'" in s
    assert s.rstrip().endswith(
        f"exec python3 -m jupyter lab --no-browser --ip=127.0.0.1 --port=30000 "
        f"'--ServerApp.root_dir={tmp_path}/my notebooks'"
    )
    assert tunnel_command(job, "gpu017", "me@login") == "ssh -N -J me@login -L 30000:127.0.0.1:30000 gpu017"


def test_bad_values_and_no_sbatch(monkeypatch, tmp_path, capsys):
    with pytest.raises(NotebookError, match="--time '4h': use Slurm's format"):
        batch_script(NotebookJob(time="4h"))
    with pytest.raises(NotebookError, match="--port 80"):
        batch_script(NotebookJob(port=80))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NotebookError, match="sbatch is not on the PATH: run this on a Slurm login node"):
        submit(NotebookJob())
    assert main(["notebook"]) == 2
    assert capsys.readouterr().err.startswith("hpctrain: error: sbatch is not on the PATH")


def test_cluster_profile_supplies_site_defaults(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["notebook", "--cluster", "example-ib", "--dry-run", "--port", "23456"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --partition=gpu" in out
    assert "HPCTRAIN_MODULES=${HPCTRAIN_MODULES-'cuda/12.4 nccl/2.21'}" in out and "module purge" in out
    assert "exec apptainer exec --nv /shared/images/hpctrain-pytorch-23.12.sif jupyter lab" in out
    # flags still win over the profile
    assert main(["notebook", "--cluster", "example-ib", "--partition", "debug", "--dry-run"]) == 0
    assert "#SBATCH --partition=debug" in capsys.readouterr().out

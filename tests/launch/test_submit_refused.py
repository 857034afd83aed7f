"""A Slurm submission that cannot go through leaves nothing behind: no sbatch when the controller does
not answer `scontrol ping` (launch.prepare.check_controller: one line naming what to check), and when
sbatch itself refuses the job, the run directory as the submission found it (launch.undo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import free_port
from tests.launch.jobs import digits_sets

ROOT = Path(__file__).resolve().parents[2]


def calls(log: Path) -> list[str]:
    """The Slurm commands hpctrain ran ($HPCTRAIN_SLURM_CALL_LOG)."""
    return [json.loads(line)["kind"] for line in log.read_text().splitlines()] if log.exists() else []


def submit(env: dict[str, str], run_dir: Path, root: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", "submit", "--config", "configs/digits_vit.yaml", *flags]
        + digits_sets(root, run_dir, "x", "train.max_steps=2"),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )


def test_no_sbatch_and_nothing_written_when_the_controller_does_not_answer(digits_root, tmp_path):
    """A real Slurm client whose slurm.conf names a port where no controller listens: `scontrol ping`
    says DOWN at once, sbatch would try and print its raw errors."""
    port = free_port()
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        f"ClusterName=gone\nSlurmctldHost=localhost\nSlurmctldPort={port}\nAuthType=auth/munge\n"
        "NodeName=n1 CPUs=1 State=UNKNOWN\nPartitionName=gpu Nodes=n1 Default=YES\n"
    )
    log = tmp_path / "calls.jsonl"
    env = {**os.environ, "SLURM_CONF": str(conf), "HPCTRAIN_SLURM_CALL_LOG": str(log), "HPCTRAIN_CLUSTER": ""}
    r = submit(
        env, tmp_path / "runs", digits_root, "--cluster", "example-ib", "--cluster-set", "container.runtime=none"
    )
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(
        f"hpctrain: error: cluster example-ib: the Slurm controller at localhost:{port} did not answer "
        "`scontrol ping` (Slurmctld(primary) at "
    ), r.stderr
    assert f"SlurmctldPort in {conf}" in r.stderr and "nothing was submitted" in r.stderr, r.stderr
    assert "sbatch" not in calls(log) and calls(log), calls(log)
    assert not (tmp_path / "runs").exists()


def test_a_sweep_to_a_controller_that_does_not_answer_runs_no_sbatch_and_writes_nothing(digits_root, tmp_path):
    """The same check before a sweep's array: `sweep` submits through its own path (start_sweep)."""
    port = free_port()
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=gone\nSlurmctldHost=localhost\nSlurmctldPort={port}\nAuthType=auth/munge\n")
    log = tmp_path / "calls.jsonl"
    env = {**os.environ, "SLURM_CONF": str(conf), "HPCTRAIN_SLURM_CALL_LOG": str(log), "HPCTRAIN_CLUSTER": ""}
    sets = ["--set", f"data.root={digits_root}", "--set", f"run.dir={tmp_path / 'runs'}", "--set", "train.max_steps=2"]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpctrain",
            "sweep",
            "--config",
            "configs/digits_vit.yaml",
            "--grid",
            "optim.lr=1e-3,2e-3",
        ]
        + ["--name", "s", "--cluster", "example-ib", "--cluster-set", "container.runtime=none", *sets],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"the Slurm controller at localhost:{port} did not answer `scontrol ping`" in r.stderr, r.stderr
    assert "sbatch" not in calls(log) and calls(log), calls(log)
    assert not (tmp_path / "runs").exists()


def test_a_slurm_pack_to_a_controller_that_does_not_answer_runs_no_sbatch_and_writes_nothing(digits_root, tmp_path):
    """`data pack --slurm` is prepared as every other job (launch.prepare's Pack): the same check
    before its array's sbatch, and no plan under OUT/.pack; a dry run asks no controller."""
    port = free_port()
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=gone\nSlurmctldHost=localhost\nSlurmctldPort={port}\nAuthType=auth/munge\n")
    log = tmp_path / "calls.jsonl"
    env = {**os.environ, "SLURM_CONF": str(conf), "HPCTRAIN_SLURM_CALL_LOG": str(log), "HPCTRAIN_CLUSTER": ""}
    out = tmp_path / "shards"
    pack = [sys.executable, "-m", "hpctrain", "data", "pack", str(digits_root), str(out), "--slurm"]
    pack += ["--cluster", "example-ib", "--cluster-set", "container.runtime=none"]
    r = subprocess.run(pack, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    last = r.stderr.strip().splitlines()[-1]  # after the plan's progress lines
    assert last.startswith("hpctrain: error: cluster example-ib: the Slurm controller at "), r.stderr
    assert f"localhost:{port} did not answer `scontrol ping`" in last and "nothing was submitted" in last, last
    assert "sbatch" not in calls(log) and calls(log) == ["scontrol"], calls(log)
    assert not out.exists()
    log.unlink()
    dry = subprocess.run([*pack, "--dry-run"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert dry.returncode == 0 and "#SBATCH --array=" in dry.stdout, dry.stdout + dry.stderr
    assert calls(log) == [] and not out.exists()


def test_a_refused_sbatch_leaves_a_new_run_nothing_and_an_earlier_attempts_run_as_it_was(
    slurm_cluster, digits_root, tmp_path
):
    """sbatch refuses a constraint no node has; its own `sbatch: error` lines are not repeated."""
    env = slurm_cluster.environ({"OMP_NUM_THREADS": "1", "HPCTRAIN_CLUSTER": "local"})
    runs = tmp_path / "runs"
    r = submit(env, runs, digits_root, "--constraint", "nosuchfeature")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith("hpctrain: error: sbatch refused the job: "), r.stderr
    assert "\nsbatch: error" not in "\n" + r.stderr, r.stderr
    assert not runs.exists()

    earlier = {  # an earlier attempt's files: its logs, its snapshot, which snapshot was the last
        "submitit/17_0_log.out": "step 20\n",
        "code/0123abcd/hpctrain/__init__.py": "",
        "code/latest": "0123abcd\n",
        "metrics.jsonl": '{"step": 20}\n',
    }
    for name, text in earlier.items():
        (runs / "x" / name).parent.mkdir(parents=True, exist_ok=True)
        (runs / "x" / name).write_text(text)
    r = submit(env, runs, digits_root, "--constraint", "nosuchfeature")
    assert r.returncode == 2 and "sbatch refused the job" in r.stderr, r.stdout + r.stderr
    left = {str(p.relative_to(runs / "x")): p.read_text() for p in (runs / "x").rglob("*") if p.is_file()}
    assert left == earlier

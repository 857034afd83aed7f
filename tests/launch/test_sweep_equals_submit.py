"""A sweep member is submitted with the config a single `hpctrain submit` of the same values gets:
both go through launch.prepare. The submission ends at a fake `sbatch` (the id Slurm would print);
the configs compared are the ones the jobs' pickles carry, what the tasks train with."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from submitit.core.utils import DelayedSubmission

from tests.helpers import DIGITS, hpctrain

# a profile that answers without a Slurm cluster: the host's Python, no GPUs, a per-node MTBF of its own
PROFILE = [
    "--cluster",
    "local",
    "--cluster-set",
    "container.runtime=none",
    "--cluster-set",
    "slurm.request_gpus=false",
    "--cluster-set",
    "slurm.node_mtbf_hours=1000",
    "--gpus-per-node",
    "1",
]


def fake_slurm(tmp_path: Path) -> dict:
    """sbatch that accepts every job as Slurm's prints it, and `scontrol ping` that says UP (a submission
    asks it first); no controller for anything else (an empty slurm.conf: the real scontrol, sacct and
    squeue fail at once)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text('#!/bin/sh\necho "Submitted batch job 4242"\n')
    (bin_dir / "sbatch").chmod(0o755)
    ping = 'if [ "$1" = ping ]; then echo "Slurmctld(primary) at fake is UP"; exit 0; fi'
    rest = f'exec {shutil.which("scontrol")} "$@"' if shutil.which("scontrol") else "exit 1"
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\n{ping}\n{rest}\n")
    (bin_dir / "scontrol").chmod(0o755)
    conf = tmp_path / "empty-slurm.conf"
    conf.write_text("")
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SLURM_CONF": str(conf),
        "HPCTRAIN_CLUSTER": "",
        "HPCTRAIN_SET": "",
        "HPCTRAIN_CONFIG": "",
    }


def submitted_config(pickle: Path) -> dict:
    """The config a job's pickled train_task call carries."""
    return DelayedSubmission.load(pickle).args[0]


def test_a_sweep_members_config_is_a_single_submissions(digits_root, tmp_path):
    env = fake_slurm(tmp_path)
    sets = ["--set", f"data.root={digits_root}", "--set", "ckpt.every=auto", "--set", "optim.lr=1e-3"]
    one, many = tmp_path / "one", tmp_path / "many"
    single = hpctrain(
        "submit",
        "--config",
        str(DIGITS),
        *sets,
        "--set",
        f"run.dir={one}",
        "--set",
        "run.name=00-lr5e-4",
        "--set",
        "optim.lr=5e-4",
        *PROFILE,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert single.returncode == 0, single.stdout + single.stderr
    sweep = hpctrain(
        "sweep",
        "--config",
        str(DIGITS),
        *sets,
        "--set",
        f"run.dir={many}",
        "--grid",
        "optim.lr=5e-4,1e-3",
        "--name",
        "sw",
        *PROFILE,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    alone = submitted_config(one / "00-lr5e-4" / "submitit" / "4242_submitted.pkl")
    member = submitted_config(many / "sw" / "submitit" / "4242_0_submitted.pkl")
    assert alone["ckpt"]["mtbf_h"] == 1000.0, alone["ckpt"]  # the profile's MTBF, resolved at submission
    assert member["run"] == {**alone["run"], "dir": str(many / "sw")}
    differ = {
        f"{part}.{k}": (member[part].get(k), v)
        for part in alone
        if part != "run"
        for k, v in alone[part].items()
        if member[part].get(k) != v
    }
    assert not differ, f"member vs single submission: {differ}"
    assert {**member, "run": None} == {**alone, "run": None}

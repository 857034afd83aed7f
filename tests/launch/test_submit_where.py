"""Where a job without a site profile goes (launch.prepare.slurm_profile, site.slurm_cli.slurm_here):
this machine only with --local or where there is no Slurm to submit to (no sbatch, or a client
with no configuration); a controller that answers, or one that does not answer in time, is
refused in one line, so a slow controller never turns a cluster job into training on the login node."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpctrain.errors import LaunchError
from hpctrain.launch.prepare import slurm_profile
from hpctrain.site.slurm_cli import slurm_here
from tests.launch.jobs import digits_sets

ROOT = Path(__file__).resolve().parents[2]


def test_no_sbatch_on_path_is_no_slurm(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no Slurm client at all
    monkeypatch.delenv("HPCTRAIN_CLUSTER", raising=False)
    assert slurm_here().state == "none"
    assert slurm_profile(None, []) is None


def test_a_slurm_client_with_an_empty_slurm_conf_is_unconfigured(tmp_path, monkeypatch):
    """The real scontrol exits at once with "Unable to process configuration file"."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.delenv("HPCTRAIN_CLUSTER", raising=False)
    here = slurm_here()
    assert (here.state, here.local) == ("unconfigured", True), here
    assert "Unable to process configuration file" in here.why
    assert slurm_profile(None, []) is None


def test_slurm_conf_naming_no_file_is_unconfigured_without_the_60_s_retry(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "none.conf"))
    here = slurm_here(timeout=3)
    assert here.state == "unconfigured" and "does not exist" in here.why, here


@pytest.mark.skipif(os.path.exists("/etc/slurm/slurm.conf"), reason="this machine has a slurm.conf at the default path")
def test_slurm_installed_but_never_configured_is_unconfigured(monkeypatch):
    """README command 1 on a machine with the Slurm packages and no slurm.conf (CI's): scontrol finds
    no configuration file and no configless source, and says so at once."""
    monkeypatch.delenv("SLURM_CONF", raising=False)
    here = slurm_here()
    assert (here.state, here.local) == ("unconfigured", True), here
    assert "Could not establish a configuration source" in here.why


def test_local_with_cluster_or_a_script_is_refused(monkeypatch):
    monkeypatch.delenv("HPCTRAIN_CLUSTER", raising=False)
    with pytest.raises(LaunchError, match="--local runs the job on this machine and --cluster example-ib"):
        slurm_profile("example-ib", [], local=True)
    with pytest.raises(LaunchError, match="a dry run or --emit-sbatch writes a Slurm batch script"):
        slurm_profile(None, [], slurm=True, local=True)


def hp_env(cluster, **extra: str) -> dict[str, str]:
    """The test cluster's environment with no profile named."""
    env = {k: v for k, v in cluster.environ({"OMP_NUM_THREADS": "1", **extra}).items() if k != "HPCTRAIN_CLUSTER"}
    return env


def submit_here(cluster, run_dir: Path, root: Path, *flags: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", "submit", "--config", "configs/digits_vit.yaml", *flags]
        + digits_sets(root, run_dir, "where", "train.max_steps=2"),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=hp_env(cluster),
        timeout=timeout,
    )


def test_submit_without_a_profile_to_an_answering_controller_is_refused_in_one_line(
    slurm_cluster, digits_root, tmp_path
):
    before = slurm_cluster.run("squeue", "-h", "-o", "%i").stdout.split()
    r = submit_here(slurm_cluster, tmp_path, digits_root)
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr == (
        "hpctrain: error: a Slurm controller answers here but no site profile is named: run `hpctrain cluster "
        "init` once, then submit with --cluster NAME (or set $HPCTRAIN_CLUSTER); --local runs the job on this "
        "machine instead\n"
    )
    assert not (tmp_path / "where").exists()  # nothing written, nothing run here
    assert slurm_cluster.run("squeue", "-h", "-o", "%i").stdout.split() == before


def test_local_flag_runs_here_although_a_controller_answers(slurm_cluster, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    monkeypatch.delenv("HPCTRAIN_CLUSTER", raising=False)
    assert slurm_here().state == "up"
    assert slurm_profile(None, [], local=True) is None  # submitit's local executor
    with pytest.raises(LaunchError, match="no site profile is named"):
        slurm_profile(None, [])
    monkeypatch.setenv("HPCTRAIN_CLUSTER", "local")  # a profile named: the Slurm job it asks for
    assert slurm_profile(None, []).name == "local"


def test_submit_while_the_controller_stalls_is_refused_and_trains_nothing_here(slurm_cluster, digits_root, tmp_path):
    """The old rule: no "UP" within 10 s → submitit's local executor, training on the login node."""
    stall = threading.Thread(target=slurm_cluster.pause_slurmctld, args=(20,))
    stall.start()
    try:
        time.sleep(0.5)  # SIGSTOP sent
        r = submit_here(slurm_cluster, tmp_path, digits_root)
    finally:
        stall.join()
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("hpctrain: error: Slurm is configured here but `scontrol ping` gave no UP within 10 s ")
    assert "the job does not fall back to this machine" in r.stderr and "--local" in r.stderr, r.stderr
    assert not (tmp_path / "where").exists()  # no local job's run directory, no process trained

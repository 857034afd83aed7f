"""Sites whose nodes and QOS limit what a job may ask (docs/sites.md), on a Slurm test cluster of
that shape: node n1 (partition `cpu`) keeps one of its 4 cores for the system (CoreSpecCount=1:
CPUEfctv=3), and QOS limits are enforced (AccountingStorageEnforce=limits,qos) with a QOS `short`
(MaxWall=00:10:00, no DenyOnLimit: sbatch accepts a longer job, which then pends for ever).
Limit checks without Slurm at the end."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from hpctrain.errors import LaunchError
from hpctrain.launch.submit import Request, check_request
from hpctrain.site.profile import load_profile
from tests.helpers import wait_for
from tests.launch.jobs import hp
from tests.slurm_cluster import CPU_NODE, CPU_PARTITION, SlurmCluster, missing

FAKE_APPTAINER = Path(__file__).with_name("fake_apptainer.sh")
QOS, WALL = "short", "00:10:00"


@pytest.fixture(scope="module")
def site_cluster(tmp_path_factory):
    """Its own cluster: CoreSpecCount and enforced QOS limits would change what the session's
    cluster gives every other test."""
    why = missing()
    if why:
        pytest.skip(why)
    c = SlurmCluster(
        tmp_path_factory.mktemp("slurm-site"),
        node_options={CPU_NODE: "CoreSpecCount=1"},
        conf_extra="AccountingStorageEnforce=limits,qos",
    ).start()
    try:
        c.run("sacctmgr", "-i", "add", "qos", QOS, f"MaxWall={WALL}", "MaxTRESPerJob=node=1")
        c.run("sacctmgr", "-i", "modify", "user", "root", "set", f"qos+={QOS}", f"defaultqos={QOS}")
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def site_profile(site_cluster, tmp_path_factory):
    """`hpctrain cluster init site --partition cpu --probe --image` on it: (profile path, env, text)."""
    d = tmp_path_factory.mktemp("site-profile")
    (d / "bin").mkdir()
    (d / "bin" / "apptainer").symlink_to(FAKE_APPTAINER)
    (d / "image.sif").write_bytes(b"fake")
    env = {
        "XDG_CONFIG_HOME": str(d / "xdg"),
        "USER": "root",
        "PATH": f"{d / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "FAKE_APPTAINER_PYTHON": sys.executable,
    }
    r = hp(
        site_cluster,
        "cluster",
        "init",
        "site",
        "--partition",
        CPU_PARTITION,
        "--probe",
        "--image",
        str(d / "image.sif"),
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    path = d / "xdg" / "hpctrain" / "clusters" / "site.yaml"
    return path, env, path.read_text()


@pytest.mark.slurm
def test_corespec_node_is_sized_by_cpuefctv(site_cluster, site_profile, tmp_path):
    """Site property: CoreSpecCount=1 on n1. CPUTot (4) is more than a job can have: sbatch refuses
    --cpus-per-task=4 ("Requested node configuration is not available"); the profile uses CPUEfctv."""
    node = site_cluster.run("scontrol", "show", "node", CPU_NODE, "-o").stdout
    assert "CPUEfctv=3 CPUTot=4" in node and "CoreSpecCount=1" in node
    path, env, text = site_profile
    assert yaml.safe_load(text)["slurm"]["cpus_per_node"] == 3
    assert "CPUEfctv, CPUTot=4 less specialised cores" in text
    dry = hp(
        site_cluster,
        "submit",
        "--cluster",
        "site",
        "--config",
        "configs/digits_vit.yaml",
        "--set",
        f"run.dir={tmp_path}",
        "--dry-run=full",
        env=env,
    )
    assert dry.returncode == 0, dry.stderr
    assert "#SBATCH --cpus-per-task=3" in dry.stdout and f"#SBATCH --qos={QOS}" in dry.stdout
    (tmp_path / "job.sh").write_text(dry.stdout)
    test = site_cluster.run("sbatch", "--test-only", str(tmp_path / "job.sh"), cwd=tmp_path, check=False)
    assert test.returncode == 0 and f"in partition {CPU_PARTITION}" in test.stderr, test.stderr


@pytest.mark.slurm
def test_time_over_the_qos_maxwall_is_refused_at_submit(site_cluster, site_profile, tmp_path):
    """Site property: QOS MaxWall enforced (AccountingStorageEnforce=limits,qos), no DenyOnLimit:
    sbatch takes a longer job and it pends for ever (QOSMaxWallDurationPerJobLimit). `submit`
    refuses it in one line naming the limit, where it came from, and the fix."""
    job = site_cluster.run(
        "sbatch", "--parsable", f"--qos={QOS}", "--time=30", "-p", CPU_PARTITION, "--wrap", "true", cwd=tmp_path
    ).stdout.strip()
    reason = site_cluster.run("squeue", "-h", "-j", job, "-o", "%T %r").stdout.split()
    site_cluster.run("scancel", job)
    assert reason == ["PENDING", "QOSMaxWallDurationPerJobLimit"]
    path, env, text = site_profile
    limits = yaml.safe_load(text)["slurm"]["limits"]
    assert limits["qos"] == QOS and limits["qos_max_wall"] == WALL and limits["qos_max_tres_per_job"] == "node=1"
    assert yaml.safe_load(text)["slurm"]["time"] == WALL  # the default fits the QOS
    r = hp(
        site_cluster,
        "submit",
        "--cluster",
        "site",
        "--config",
        "configs/digits_vit.yaml",
        "--time",
        "30",
        "--set",
        f"run.dir={tmp_path}",
        env=env,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stdout + r.stderr
    assert (
        f"--time=30 is over QOS {QOS}'s MaxWall={WALL} (`sacctmgr show qos {QOS}`; cluster profile 'site', "
        f"slurm.limits.qos_max_wall): use --time {WALL} or less, or another --qos"
    ) in r.stderr
    assert site_cluster.run("squeue", "-h").stdout.strip() == ""  # nothing was submitted


@pytest.mark.slurm
def test_probe_runs_in_the_image_under_the_profiles_account_and_qos(site_cluster, site_profile):
    """Site property: QOS limits enforced and an image the tasks run in. The probe's srun is charged
    as the jobs will be, and the doctor reports from inside the image (its NCCL, not the login node's)."""
    path, env, text = site_profile
    assert "#   in the image: NCCL" in text

    def ended() -> list[str] | None:
        # slurmdbd records the probe's end some time after srun returned (seconds on a loaded machine)
        rows = site_cluster.run("sacct", "-n", "-X", "-P", "--name=hpctrain-probe", "-o", "Account,QOS,State").stdout
        rows = rows.split()
        return rows if rows and not any(r.endswith(("|PENDING", "|RUNNING", "|COMPLETING")) for r in rows) else None

    rows = wait_for(
        ended,
        "no final accounting row for the probe job",
        120,
        lambda: site_cluster.run("sacct", "-n", "-X", "-P", "-o", "JobID,JobName,Account,QOS,State").stdout,
    )
    assert rows == [f"root|{QOS}|COMPLETED"], rows


def profile_with(tmp_path: Path, **limits: str):
    p = tmp_path / "p.yaml"
    p.write_text(
        yaml.safe_dump(
            {
                "name": "site",
                "slurm": {
                    "partition": "gpu",
                    "qos": "normal",
                    "gpus_per_node": 4,
                    "max_gpus_per_node": 4,
                    "cpus_per_node": 64,
                    "time": "1:00:00",
                    "limits": limits,
                },
            }
        )
    )
    return load_profile(p)


def test_partition_maxtime_and_qos_tres_limits_refused_in_one_line(tmp_path):
    prof = profile_with(
        tmp_path,
        partition="gpu",
        max_time="2-00:00:00",
        qos="normal",
        qos_max_tres_per_job="cpu=512,gres/gpu=16,node=4",
        qos_max_tres_per_user="gres/gpu=8",
    )
    with pytest.raises(
        LaunchError,
        match=r"^--time=3-00:00:00 is over partition gpu's MaxTime=2-00:00:00 "
        r"\(`scontrol show partition gpu`; .*: use --time 2-00:00:00 or less",
    ):
        check_request(prof, Request(nodes=1, time="3-00:00:00"))
    assert check_request(prof, Request(nodes=1, time="3-00:00:00", partition="long"))[2] == "3-00:00:00"
    with pytest.raises(
        LaunchError,
        match=r"asks gres/gpu=12, over QOS normal's MaxTRESPerUser gres/gpu=8 .*"
        r"use --nodes 2 or fewer, or another --qos",
    ):
        check_request(prof, Request(nodes=3))
    assert check_request(prof, Request(nodes=3, qos="big"))[0] == 3  # the limits are QOS normal's
    assert check_request(prof, Request(nodes=2))[:2] == (2, 4)

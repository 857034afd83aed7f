"""`hpctrain cluster init NAME`: a profile read from the Slurm test cluster (GPU and CPU partitions,
an account with two QOS, a test Lmod tree), a valid job from it, refusals, and `--probe`'s fabric
section from the doctor's JSON on fake sysfs trees (tests/doctor/fake_sysfs.py, a plugin of tests/conftest.py)."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from hpctrain.site import cluster_init as ci
from hpctrain.site.profile import load_profile
from hpctrain.site.slurm_cli import parse_kv
from tests.doctor.fake_sysfs import DGX_COMPUTE, run_cli
from tests.helpers import hpctrain
from tests.launch.jobs import hp
from tests.slurm_cluster import CPU_PARTITION, GPU_NODE, GPU_PARTITION, GPU_TYPE, GPUS_PER_NODE

ACCOUNT, QOS = "hpcsite", ("hpc-normal", "hpc-long")


def test_parsers_of_slurm_records():
    kv = parse_kv("NodeName=n2 Arch=x86_64 CPUTot=4 Gres=gpu:tesla:2(S:0) OS=Linux 6.1.0-18 #1 SMP RealMemory=4000")
    assert kv["OS"] == "Linux 6.1.0-18 #1 SMP" and kv["RealMemory"] == "4000" and kv["CPUTot"] == "4"
    assert ci.parse_gres(kv["Gres"]) == ("tesla", 2)
    assert ci.parse_gres("gpu:4,shard:8") == ("", 4) and ci.parse_gres("(null)") == ("", 0)
    assert ci.pick_module(["apptainer/1.2.5", "apptainer/1.10.0", "cuda/12.4"], "apptainer") == "apptainer/1.10.0"


@pytest.mark.parametrize(
    "fixture, kind, port",
    [("dgx_h100", "ib", "mlx5_11:1 ACTIVE InfiniBand"), ("roce_node", "roce", "mlx5_0:1 ACTIVE Ethernet")],
)
def test_probe_fabric_section_from_doctor_json(request, capsys, fixture, kind, port):
    """What `--probe` does with the compute node's `hpctrain doctor --json` (here: against fake sysfs)."""
    _, out = run_cli(capsys, "doctor", "--json", "--sysfs-root", str(request.getfixturevalue(fixture)))
    got_kind, notes = ci.fabric_from_doctor(json.loads(out))
    assert got_kind == kind and any(n.startswith(port) for n in notes), notes
    part = ci.Partition("gpu", True, "UNLIMITED", ["g1"], False, 8, "h100", 96, 2000000)
    text, _ = ci.render("site", ci.Facts([part], user="me"), part, (got_kind, notes))
    prof = yaml.safe_load(text)
    assert prof["fabric"] == {"kind": kind} and "--probe: `hpctrain doctor --json`" in text
    if kind == "ib":  # the doctor's GPU-near rails, as a comment: the profile leaves NCCL_IB_HCA to NCCL
        assert "doctor suggests NCCL_IB_HCA==" + ",".join(f"{d}:1" for d in DGX_COMPUTE) in text
    else:
        assert "RoCE v2 GID 3" in text
    (tmp := request.getfixturevalue("tmp_path") / "p.yaml").write_text(text)
    assert load_profile(tmp).slurm.exclusive  # 8 GPUs per node: whole nodes


def test_without_slurm_and_existing_profile(tmp_path):
    (tmp_path / "bin").mkdir()
    env = {"PATH": str(tmp_path / "bin"), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    r = hpctrain("cluster", "init", "site", env=env)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no Slurm here" in r.stderr, r.stderr
    prof = tmp_path / "xdg" / "hpctrain" / "clusters" / "site.yaml"
    prof.parent.mkdir(parents=True)
    prof.write_text("name: mine\n")
    r = hpctrain("cluster", "init", "site", env=env)
    assert r.returncode == 2 and "exists: pass --force" in r.stderr and prof.read_text() == "name: mine\n"


@pytest.fixture
def site(slurm_cluster):
    """An account with two QOS as root's default association (undone after: other tests see root's)."""
    run = slurm_cluster.run
    run("sacctmgr", "-i", "add", "qos", *QOS, check=False)  # exists already on a second use
    run("sacctmgr", "-i", "add", "account", ACCOUNT, "Description=test", "Organization=test", check=False)
    run(
        "sacctmgr",
        "-i",
        "add",
        "user",
        "root",
        f"account={ACCOUNT}",
        f"qos={','.join(QOS)}",
        f"defaultqos={QOS[0]}",
        check=False,
    )
    run("sacctmgr", "-i", "modify", "user", "root", "set", f"defaultaccount={ACCOUNT}")
    yield
    run("sacctmgr", "-i", "modify", "user", "root", "set", "defaultaccount=root")


@pytest.mark.slurm
def test_cluster_init_on_the_test_cluster(slurm_cluster, site, tmp_path):
    mods = tmp_path / "modulefiles"
    # each runtime module puts a stand-in on PATH that answers --version as the real one does: the
    # newest apptainer, and a SingularityCE whose module must not reach a profile that runs apptainer
    tools = {
        "apptainer/1.2.5": ("apptainer", "apptainer version 1.2.5"),
        "apptainer/1.3.4": ("apptainer", "apptainer version 1.3.4"),
        "singularity/4.1.0": ("singularity", "singularity-ce version 4.1.0"),
    }
    for name in (*tools, "cuda/12.4"):
        (mods / name).parent.mkdir(parents=True, exist_ok=True)
        lua = 'setenv("HPCTRAIN_TEST_MODULE", "1")\n'
        if name in tools:
            bindir = tmp_path / "tools" / name
            bindir.mkdir(parents=True)
            (bindir / tools[name][0]).write_text(f"#!/bin/sh\necho '{tools[name][1]}'\n")
            (bindir / tools[name][0]).chmod(0o755)
            lua += f'prepend_path("PATH", "{bindir}")\n'
        (mods / f"{name}.lua").write_text(lua)
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "MODULEPATH": str(mods), "USER": "root"}
    r = hp(slurm_cluster, "cluster", "init", "site", "--probe", env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    path = tmp_path / "xdg" / "hpctrain" / "clusters" / "site.yaml"
    text = path.read_text()
    prof = yaml.safe_load(text)
    s = prof["slurm"]
    assert s["partition"] == GPU_PARTITION and s["gpus_per_node"] == s["max_gpus_per_node"] == GPUS_PER_NODE
    assert f"Gres=gpu:{GPU_TYPE}:{GPUS_PER_NODE}" in text and f"scontrol show node {GPU_NODE}" in text
    assert s["cpus_per_node"] == 4 and "RealMemory=4000 MB" in text and s["time"] == "2-00:00:00"
    assert "2 per GPU: each task's --cpus-per-task" in text and s["cpu_bind"] == "cores"
    assert s["account"] == ACCOUNT and s["qos"] == QOS[0] and "QOS=hpc-long,hpc-normal" in text
    assert prof["container_modules"] == ["apptainer/1.3.4"] and prof["modules"] == ["cuda/12.4"]
    assert prof["container"]["runtime"] == "none" and "found: apptainer --version: apptainer version 1.3.4" in text
    assert "singularity --version: singularity-ce version 4.1.0 (module singularity/4.1.0)" in text
    assert re.search(rf"# Partitions seen: .*{CPU_PARTITION}: 1 nodes, no GPUs", text)
    assert prof["fabric"] == {"kind": "socket"} and "no InfiniBand/RoCE ports" in text  # --probe, srun on n2
    for line in text.splitlines():  # every value says where it came from
        if re.match(r"^\s*\w+: ", line) and not line.startswith("name:"):
            assert " # " in line, line
    assert (
        "review: partition gpu" in r.stdout
        and "review: qos hpc-normal; account hpcsite may also use: hpc-long" in r.stdout
    )
    # `--cluster site` finds it; the job it makes is one the controller would run
    dry = hp(
        slurm_cluster,
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
    for line in (
        f"#SBATCH --partition={GPU_PARTITION}",
        f"#SBATCH --gpus-per-node={GPUS_PER_NODE}",
        f"#SBATCH --account={ACCOUNT}",
        f"#SBATCH --qos={QOS[0]}",
        "#SBATCH --cpus-per-task=2",  # 4 CPUs, 2 GPUs: each task its GPU's share
        "--cpu-bind=cores --gpu-bind=none",
    ):
        assert line in dry.stdout
    (tmp_path / "job.sh").write_text(dry.stdout)
    test = slurm_cluster.run("sbatch", "--test-only", str(tmp_path / "job.sh"), cwd=tmp_path, check=False)
    assert test.returncode == 0 and f"in partition {GPU_PARTITION}" in test.stderr, test.stderr
    again = hp(slurm_cluster, "cluster", "init", "site", env=env)
    assert again.returncode == 2 and "exists: pass --force" in again.stderr and path.read_text() == text

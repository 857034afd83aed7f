"""Cluster profiles, NCCL/module/container lines and planning checks (no cluster, no torch)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.config import ConfigError, load
from hpctrain.launch.modules import job_module_lines, module_lines
from hpctrain.launch.submit import LaunchError, Request, plan_job
from hpctrain.site.fabric import fabric_env
from hpctrain.site.profile import CLUSTER_DIR, load_profile, time_minutes


def test_shipped_profiles_load():
    names = sorted(p.stem for p in CLUSTER_DIR.glob("*.yaml"))
    assert names == ["example-ib", "example-roce", "local"]
    ib = load_profile("example-ib")
    assert ib.fabric.kind == "ib" and ib.fabric.hcas == [] and ib.fabric.ifname == ""
    assert ib.container.runtime == "apptainer" and ib.container.image.endswith(".sif")
    assert load_profile("local").container.runtime == "none"


@pytest.mark.parametrize("name", ["example-ib", "example-roce", "local"])
def test_shipped_profiles_leave_hca_interface_and_gid_to_nccl(name):
    """A wrong HCA list, interface or GID index fails or slows every job; unset, NCCL picks the
    GPU-near HCAs, an interface and (>= 2.21) the RoCE v2 GID itself."""
    env = fabric_env(load_profile(name))
    for var in ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_GID_INDEX"):
        assert var not in env, var


def test_profile_hcas_are_written_exact():
    """Without '=' NCCL reads mlx5_1 as a prefix (mlx5_10 … too): always the exact =dev:port form."""
    env = fabric_env(load_profile("example-ib", ["fabric.hcas=[mlx5_1]"]))
    assert env["NCCL_IB_HCA"] == "=mlx5_1:1"
    env = fabric_env(load_profile("example-roce", ["fabric.hcas=[mlx5_0, mlx5_3:2, mlx5_10]"]))
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_3:2,mlx5_10:1"


def test_profile_ifname_is_for_nccl_only_and_gid_index_only_when_asked():
    env = fabric_env(load_profile("example-ib", ["fabric.ifname=^docker,lo", "fabric.gid_index=0"]))
    assert env["NCCL_SOCKET_IFNAME"] == "^docker,lo" and "GLOO_SOCKET_IFNAME" not in env
    assert env["NCCL_IB_GID_INDEX"] == "0"
    assert load_profile("example-roce").fabric.gid_index == -1


def test_fabric_env_per_kind_and_overrides():
    ib = fabric_env(load_profile("example-ib"))
    assert ib["NCCL_IB_TIMEOUT"] == "22" and ib["NCCL_IB_RETRY_CNT"] == "7"
    assert ib["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3" and ib["NCCL_IB_DISABLE"] == "0"
    sock = fabric_env(load_profile("local"))
    assert sock["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_HCA" not in sock
    # every value can be overridden: fabric keys, then the profile's env mapping wins
    p = load_profile("example-ib", ["fabric.ib_timeout=18", "env.NCCL_IB_HCA=mlx5_4", "fabric.nccl_debug=INFO"])
    env = fabric_env(p)
    assert (env["NCCL_IB_TIMEOUT"], env["NCCL_IB_HCA"], env["NCCL_DEBUG"]) == ("18", "mlx5_4", "INFO")


@pytest.mark.parametrize(
    "bad, word",
    [
        (["fabric.kind=infini"], "not one of ib, roce, socket"),
        (["slurm.partiton=gpu"], "did you mean slurm.'partition'"),
        (["modules=[cuda; rm -rf /]"], "not a module name"),
        (["env.A B=1"], "not a valid environment variable name"),
        (["container.image="], "container.image is empty"),
        (
            ["slurm.report_bad_node.command=[report-node]"],
            r"report_bad_node.command=\['report-node'\]: give the program's absolute path",
        ),
        (["slurm.report_bad_node.file=bad.log"], "report_bad_node.file='bad.log': give an absolute path"),
        (["slurm.report_bad_node.timeout_s=0"], "report_bad_node.timeout_s=0 is out of range"),
        (["slurm.time=soon"], "HH:MM:SS"),
        (["fabric.hcas=[=mlx5_0]"], r"fabric.hcas: '=mlx5_0' is not an HCA port"),
        (["fabric.hcas=[mlx5_0:x]"], r"fabric.hcas: 'mlx5_0:x' is not an HCA port"),
        (["fabric.hcas=['mlx5_0,mlx5_1']"], r"fabric.hcas: 'mlx5_0,mlx5_1' is not an HCA port"),
        (["fabric.hcas=[mlx5_0:0]"], r"optionally with its port \(mlx5_0 or mlx5_0:2\)"),
        (["fabric.ifname=ib0 eth0"], "not an NCCL_SOCKET_IFNAME pattern"),
        (["fabric.gid_index=-2"], "must be >= -1"),
    ],
)
def test_bad_profiles_name_the_problem(bad, word):
    with pytest.raises(ConfigError, match=word) as e:
        load_profile("example-ib", bad)
    assert "\n" not in str(e.value)  # one line


def test_time_limits():
    assert [time_minutes(t) for t in ("90", "10:30", "24:00:00", "2-00:00:00", "1-2")] == [90, 11, 1440, 2880, 1560]


def test_module_lines_find_the_module_system_as_sites_have_it(tmp_path):
    """`module` missing in a plain batch shell: Lmod's init from $LMOD_PKG, then $MODULESHOME, then
    Debian's path; no `module purge` unless the profile asks (it can remove apptainer or slurm)."""
    text = "\n".join(module_lines(["cuda/12.4", "nccl"], ["/opt/mods dir"]))
    # the bash is in launch/shell/module_*.sh: the variable to load and the paths are the header's values
    assert "module purge" not in text and "hpctrain_modules_var=HPCTRAIN_MODULES" in text
    assert "hpctrain_module_use=('/opt/mods dir')" in text and module_lines([]) == []
    r = subprocess.run(
        ["bash", "-c", 'set -eu; module() { echo "module $*"; }\n' + text],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert r.stdout.splitlines() == ["module use /opt/mods dir", "module load cuda/12.4 nccl"], r.stdout + r.stderr
    assert "module purge" in "\n".join(module_lines(["x"], purge=True))
    fake = tmp_path / "lmod" / "init"
    fake.mkdir(parents=True)
    (fake / "bash").write_text('module() { echo "site module $*"; }\n')
    script = "\n".join(["HPCTRAIN_MODULES=", *module_lines(["a/1", "b"])]) + "\n"
    env = {"PATH": "/usr/bin:/bin", "LMOD_PKG": str(tmp_path / "lmod"), "HPCTRAIN_MODULES": "a/1 b"}
    r = subprocess.run(
        ["bash", "-c", script.replace("HPCTRAIN_MODULES=\n", "")], env=env, capture_output=True, text=True
    )
    assert r.stdout.strip() == "site module load a/1 b", r.stdout + r.stderr
    env = {"PATH": "/usr/bin:/bin", "MODULESHOME": str(tmp_path / "lmod")}
    r = subprocess.run(
        ["bash", "-c", script.replace("HPCTRAIN_MODULES=\n", "")], env=env, capture_output=True, text=True
    )
    assert r.stdout.strip() == "site module load a/1 b", r.stdout + r.stderr


def test_job_modules_follow_the_runtime():
    """Container jobs load `container_modules` (e.g. apptainer), host-Python jobs `modules`."""
    lines = job_module_lines(["cuda/12.4"], ["apptainer"], [], False)
    for runtime, loaded in (("none", "cuda/12.4"), ("apptainer", "apptainer")):
        script = "\n".join([f"CONTAINER={runtime}", 'module() { echo "module $*"; }', *lines])
        r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
        assert r.stdout.strip() == f"module load {loaded}", r.stdout + r.stderr
    ib = load_profile("example-ib")
    assert ib.container_modules == ["apptainer"] and not ib.module_purge


def test_plan_refuses_impossible_requests():
    cfg = load("vit_b16_imagenet.yaml")
    ib = load_profile("example-ib")
    with pytest.raises(LaunchError, match="--nodes 1 or more"):
        plan_job(cfg, ib, Request(nodes=0))
    with pytest.raises(LaunchError, match="at most 8 GPUs.*use --gpus-per-node 8 with --nodes 4 for 32"):
        plan_job(cfg, ib, Request(nodes=2, gpus_per_node=16))
    with pytest.raises(LaunchError, match="--time"):
        plan_job(cfg, ib, Request(nodes=2, time="tomorrow"))
    plan = plan_job(cfg, ib, Request(nodes=16, gpus_per_node=8))
    assert (plan.world_size, plan.gpus_per_node, plan.cpus_per_task) == (128, 8, 12)


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", *args], capture_output=True, text=True, timeout=60, env=env
    )


@pytest.mark.parametrize(
    "args, fix",
    [
        (["--nodes", "0"], "use --nodes 1 or more"),
        (["--nodes", "2", "--gpus-per-node", "9"], "use --gpus-per-node 8 with --nodes 3"),
        (
            ["--nodes", "2", "--cluster-set", "container.image=/nonexistent/x.sif"],
            "container.image '/nonexistent/x.sif' does not exist: build or copy the image there",
        ),
    ],
)
def test_cli_impossible_requests_fail_before_submission(args, fix, tmp_path):
    """Nothing reaches sbatch: the error is one line with the fix, exit status 2."""
    r = cli("submit", "--cluster", "example-ib", "--set", f"run.dir={tmp_path}", *args)
    assert r.returncode == 2, r.stderr
    assert fix in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert not any(tmp_path.iterdir())  # no run directory, no submitit folder


def test_a_missing_container_module_is_a_warning_and_only_a_missing_runtime_stops_the_job(tmp_path):
    """HPCTRAIN_CONTAINER_MODULES=apptainer (the example profile's) at a site without such a module:
    Debian's real Lmod fails `module load apptainer`, which under `set -e` ended the job although
    apptainer was on PATH. Now a one-line warning; the job stops (one line) only when the runtime is
    then not on PATH."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "apptainer").write_text("#!/bin/sh\n")
    (bindir / "apptainer").chmod(0o755)
    lines = job_module_lines(["cuda/12.4"], ["apptainer"], [], False)
    script = "\n".join(["set -eo pipefail", "CONTAINER=apptainer", *lines, "echo passed"])

    def run(path: str) -> subprocess.CompletedProcess:
        env = {"PATH": path, "HOME": str(tmp_path)}
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=120)

    assert Path("/usr/share/lmod/lmod/init/bash").is_file()  # the module system module_init.sh finds here
    r = run(f"{bindir}:/usr/bin:/bin")
    assert r.returncode == 0 and r.stdout.strip().endswith("passed"), r.stdout + r.stderr
    (warning,) = [line for line in r.stderr.splitlines() if line.startswith("hpctrain:")]
    assert "warning: module load apptainer failed" in warning and "apptainer on PATH" in warning, r.stderr
    r = run("/usr/bin:/bin")
    said = [line for line in r.stderr.splitlines() if line.startswith("hpctrain:")]
    assert r.returncode == 1 and "passed" not in r.stdout, r.stdout + r.stderr
    assert "apptainer is not on PATH" in said[-1] and "set HPCTRAIN_CONTAINER_MODULES" in said[-1], said


def test_nccl_error_handling_is_torchs_skip_cleanup_everywhere(monkeypatch):
    """TORCH_NCCL_ASYNC_ERROR_HANDLING=3 (torch >= 2.2's default): a failed collective ends the process
    without ncclCommAbort, which can hang on a dead peer (1 aborts first). Every profile exports it,
    and a rank started without it (no batch script; torchrun would set 1) sets it too."""
    for name in ("local", "example-ib", "example-roce"):
        assert fabric_env(load_profile(name))["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3", name
    from hpctrain.train import collective
    from hpctrain.train.dist import DistInfo

    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    monkeypatch.setattr(collective.td, "is_initialized", lambda: False)
    monkeypatch.setattr(collective.td, "init_process_group", lambda **kw: None)
    monkeypatch.setattr(collective, "set_gloo_ifname", lambda: None)
    info = DistInfo(rank=0, world_size=2, local_rank=0, master_addr="127.0.0.1", master_port=29500)
    collective.init(info, "nccl", 60)
    assert collective.os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"

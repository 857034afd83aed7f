"""container.runtime apptainer | singularity | pyxis | none: the command line each starts a task with
(a dry run's script run up to srun, which a stand-in records), what `doctor` and `cluster init` find
on a node (stand-in `apptainer`/`singularity`/`srun` that answer as the real ones do), and refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpctrain.run.source import source_hash
from hpctrain.site import cluster_init as ci
from hpctrain.site import runtimes as rt
from tests.helpers import hpctrain, this_python_as
from tests.launch.pyxis import runtime_path

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = {"apptainer": "apptainer version 1.3.4", "singularity-ce": "singularity-ce version 4.1.0"}


def fake_tool(bindir: Path, name: str, text: str) -> None:
    """A command that prints `text` for --version/--help (as the real ones' first line says)."""
    bindir.mkdir(exist_ok=True)
    (bindir / name).write_text(f"#!/bin/sh\necho {text!r}\n")
    (bindir / name).chmod(0o755)


def dry_run_srun_args(tmp_path: Path, runtime: str) -> tuple[list[str], dict[str, str], dict]:
    """`hpctrain submit --dry-run` with this runtime, the script run by bash up to and through srun (a
    stand-in that records its arguments and environment); (srun's argv, its env, the paths used)."""
    image = tmp_path / ("image.sqsh" if runtime == "pyxis" else "image.sif")
    image.write_bytes(b"fake")
    prof = tmp_path / "site.yaml"
    prof.write_text(
        yaml.safe_dump(
            {
                "name": "site",
                "slurm": {"request_gpus": False, "gpus_per_node": 2, "max_gpus_per_node": 2},
                "container": {"runtime": runtime, "image": str(image), "binds": ["/datasets:/datasets:ro"]},
            }
        )
    )
    data, runs = tmp_path / "data", tmp_path / "runs"
    r = hpctrain(
        "submit",
        "--config",
        "configs/digits_vit.yaml",
        "--cluster",
        str(prof),
        "--dry-run=full",
        "--set",
        f"data.root={data}",
        "--set",
        f"run.dir={runs}",
        "--set",
        "run.name=r",
    )
    assert r.returncode == 0, r.stderr
    snap = runs / "r" / "code" / source_hash() / "hpctrain"
    snap.mkdir(parents=True)  # where the submission would have put the code snapshot
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "srun").write_text('#!/bin/bash\nprintf "%s\\0" "$@" > "$SRUN_ARGS"\nenv -0 > "$SRUN_ENV"\n')
    (bindir / "srun").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    env = {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "SLURM_JOB_ID": "42",
        "SRUN_ARGS": str(tmp_path / "args"),
        "SRUN_ENV": str(tmp_path / "env"),
        "PYTHONPATH": "/a/module/site-packages",
    }
    run = subprocess.run(["bash", "-c", r.stdout], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    args = (tmp_path / "args").read_text().split("\0")[:-1]
    srun_env = dict(kv.split("=", 1) for kv in (tmp_path / "env").read_text().split("\0") if "=" in kv)
    paths = {
        "image": str(image),
        "data": str(data),
        "run": str(runs),
        "snap": str(snap),
        "work": str(work),
        "folder": str(runs / "r" / "submitit"),
    }
    return args, srun_env, paths


@pytest.mark.parametrize("runtime", ["apptainer", "singularity", "pyxis", "none"])
def test_dry_run_starts_each_task_with_its_runtimes_command_line(tmp_path, runtime):
    """The whole srun command line of a dry run's script, per runtime: Apptainer and SingularityCE wrap
    Python in `<tool> exec --nv --cleanenv` with the binds and the code snapshot, passing the allow-list
    under their own ENV prefix (SingularityCE ignores APPTAINERENV_*); pyxis puts the image, the same
    mounts plus the job's directory, and the working directory on srun itself and no GPU flag; none
    runs the host's Python with the snapshot first on PYTHONPATH."""
    args, env, p = dry_run_srun_args(tmp_path, runtime)
    folder = p["folder"]
    logs = ["--output", f"{folder}/%j_%t_log.out", "--error", f"{folder}/%j_%t_log.err"]
    task = ["-u", "-m", "hpctrain.launch.task", folder]
    binds = ["/datasets:/datasets:ro", p["data"], p["run"]]
    assert args[:3] == ["--kill-on-bad-exit=1", "--unbuffered", "--open-mode=append"]
    args = args[1:]  # the rest as before the append mode came in
    if runtime in ("apptainer", "singularity"):
        prefix = "APPTAINERENV_" if runtime == "apptainer" else "SINGULARITYENV_"
        wrapper = args[2 + len(logs) + 2]
        assert args[2:] == [
            *logs,
            "bash",
            "-c",
            wrapper,
            "hpctrain-task",
            runtime,
            "exec",
            "--nv",
            "--cleanenv",
            *[x for b in binds for x in ("--bind", b)],
            "--bind",
            f"{p['snap']}:/opt/hpctrain-src/hpctrain:ro",
            p["image"],
            "python3",
            *task,
        ]
        assert f"hpctrain_prefix={prefix}\n" in wrapper and '"SLURM_*" ' in wrapper  # values, then cleanenv.sh
        assert 'export "${hpctrain_prefix?}$v=${!v}"' in wrapper
        assert env[f"{prefix}PYTHONPATH"] == "/opt/hpctrain-src" and env[f"{prefix}PYTHONNOUSERSITE"] == "1"
        other = "SINGULARITYENV_" if runtime == "apptainer" else "APPTAINERENV_"
        assert not [k for k in env if k.startswith(other)]
    elif runtime == "pyxis":
        mounts = ",".join(
            [*binds[:1], *(f"{b}:{b}" for b in binds[1:]), p["work"], f"{p['snap']}:/opt/hpctrain-src/hpctrain:ro"]
        )
        wrapper = args[5 + len(logs) + 2]
        assert args[2:] == [
            f"--container-image={p['image']}",
            f"--container-mounts={mounts}",
            f"--container-workdir={p['work']}",
            *logs,
            "bash",
            "-c",
            wrapper,
            "hpctrain-task",
            "python3",
            *task,
        ]
        assert "--nv" not in args and "/etc/environment" in wrapper and "hpctrain_mount=/opt/hpctrain-src\n" in wrapper
        assert "export PYTHONPATH=${hpctrain_mount?}" in wrapper
    else:
        assert args[2:] == [*logs, sys.executable, *task]
        assert env["PYTHONPATH"] == f"{Path(p['snap']).parent}:/a/module/site-packages"


def test_pyxis_env_wrapper_keeps_the_images_variables_and_the_allow_list(tmp_path):
    """Inside a pyxis task the host environment arrives whole (the image's own values win): the wrapper
    keeps what the image's /etc/environment names and the allow-list, drops a module's PYTHONPATH and
    CUDA_HOME, and puts the snapshot mount first."""
    from hpctrain.site.runtimes.pyxis import image_env_wrapper

    etc = tmp_path / "environment"
    etc.write_text("PATH=/usr/local/nvidia/bin:/usr/bin:/bin\nexport CUDA_VERSION=12.3\nLD_LIBRARY_PATH=/img/lib\n")
    prog = image_env_wrapper(["MY_*"], "/opt/src").replace("/etc/environment", str(etc))
    env = {
        "PATH": "/usr/bin:/bin",
        "CUDA_VERSION": "12.3",
        "LD_LIBRARY_PATH": "/img/lib",
        "CUDA_HOME": "/host/cuda",
        "PYTHONPATH": "/host/module",
        "SLURM_PROCID": "3",
        "NCCL_DEBUG": "INFO",
        "MY_FLAG": "1",
        "HPCTRAIN_SOURCE": "/x/hpctrain",
        "RANDOM_HOST_VAR": "x",
    }
    r = subprocess.run(["bash", "-c", prog, "task", "env"], env=env, capture_output=True, text=True, timeout=30)
    got = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    for k in ("CUDA_VERSION", "LD_LIBRARY_PATH", "SLURM_PROCID", "NCCL_DEBUG", "MY_FLAG", "HPCTRAIN_SOURCE"):
        assert got[k] == env[k], k
    assert "CUDA_HOME" not in got and "RANDOM_HOST_VAR" not in got
    assert got["PYTHONPATH"] == "/opt/src" and got["PYTHONNOUSERSITE"] == "1"


def test_unknown_runtime_names_the_allowed_values(tmp_path):
    r = hpctrain(
        "submit", "--config", "configs/digits_vit.yaml", "--cluster-set", "container.runtime=docker", "--dry-run"
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "container.runtime='docker' is not one of apptainer, singularity, pyxis, none" in r.stderr


def test_pyxis_refuses_what_its_mounts_cannot_express(tmp_path):
    image = tmp_path / "i.sqsh"
    image.write_bytes(b"x")
    sets = ["--cluster-set", "container.runtime=pyxis", "--cluster-set", f"container.image={image}"]
    r = hpctrain(
        "submit",
        "--config",
        "configs/digits_vit.yaml",
        *sets,
        "--set",
        "data.stage_to=$TMPDIR/s",
        "--set",
        f"run.dir={tmp_path}",
        "--dry-run",
    )
    assert r.returncode == 2 and "data.stage_to='$TMPDIR/s' is not supported with container.runtime pyxis" in r.stderr
    r = hpctrain(
        "submit", "--config", "configs/digits_vit.yaml", *sets, "--set", f"run.dir={tmp_path}/a,b", "--dry-run"
    )
    assert r.returncode == 2 and "holds ','" in r.stderr, r.stderr


def test_detect_tells_apptainer_from_singularityce_and_finds_pyxis(tmp_path, monkeypatch):
    """Apptainer ships `singularity` as a link to itself (its --version says apptainer): one runtime,
    apptainer. SingularityCE answers singularity-ce and has no `apptainer`. pyxis: srun --help."""
    bindir = tmp_path / "bin"
    monkeypatch.setenv("PATH", str(bindir))
    fake_tool(bindir, "apptainer", VERSIONS["apptainer"])
    fake_tool(bindir, "singularity", VERSIONS["apptainer"])
    assert [f.runtime for f in rt.detect()] == ["apptainer"]
    (bindir / "apptainer").unlink()
    fake_tool(bindir, "singularity", VERSIONS["singularity-ce"])
    fake_tool(bindir, "srun", "      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH")
    found = rt.detect()
    assert [f.runtime for f in found] == ["singularity", "pyxis"]
    assert found[0].evidence == "singularity --version: singularity-ce version 4.1.0"


@pytest.mark.parametrize(
    "image, runtime",
    [
        ("/img/x.sif", "singularity"),
        ("/img/x.sqsh", "pyxis"),
        ("nvcr.io#nvidia/pytorch:23.12-py3", "pyxis"),
        ("", "none"),
    ],
)
def test_cluster_init_writes_the_runtime_found_and_only_its_module(tmp_path, image, runtime):
    """A site with SingularityCE (module singularity/4.1.0) and pyxis: a SIF runs with `singularity`
    and its module, an enroot image with pyxis and no module; never the apptainer runtime (absent)."""
    found = [
        rt.Found(
            "singularity",
            "singularity --version: singularity-ce version 4.1.0 (module singularity/4.1.0)",
            "singularity/4.1.0",
        ),
        rt.Found("pyxis", "srun --help lists --container-image"),
    ]
    part = ci.Partition("gpu", True, "UNLIMITED", ["g1"], False, 8, "h100", 96, 2000000)
    facts = ci.Facts([part], user="me", modules=["singularity/4.1.0", "cuda/12.4"], runtimes=found)
    text, _ = ci.render("site", facts, part, None, image)
    prof = yaml.safe_load(text)
    assert prof["container"]["runtime"] == runtime
    assert prof["container_modules"] == (["singularity/4.1.0"] if runtime in ("singularity", "none") else [])
    (tmp_path / "p.yaml").write_text(text)
    from hpctrain.site.profile import load_profile

    assert load_profile(tmp_path / "p.yaml").container.runtime == runtime


def test_doctor_lists_the_runtimes_on_this_node(tmp_path):
    bindir = tmp_path / "bin"
    fake_tool(bindir, "singularity", VERSIONS["singularity-ce"])
    r = hpctrain("doctor", env={"PATH": f"{bindir}:{os.path.dirname(sys.executable)}:/usr/bin:/bin"})
    line = next(x for x in r.stdout.splitlines() if "runtime singularity" in x)
    assert "OK" in line and "singularity --version: singularity-ce version 4.1.0" in line, r.stdout


FAKE = Path(__file__).parents[1] / "launch" / "fake_apptainer.sh"  # called as `singularity`: SingularityCE's env rules


@pytest.mark.skipif(os.geteuid() != 0, reason="the fake image runtime needs unshare --mount (root)")
@pytest.mark.parametrize("branch", ["singularity", "apptainer"])
def test_singularityce_task_gets_the_allow_list_only_through_singularityenv(tmp_path, branch):
    """SingularityCE (the fake `singularity`, which honours SINGULARITYENV_* and ignores APPTAINERENV_*):
    the singularity branch's task sees the allow-listed SLURM_PROCID, PYTHONNOUSERSITE and the code
    snapshot on PYTHONPATH, not the host module's PYTHONPATH. The same image started with the
    apptainer branch's variables (a `singularity` module on an apptainer profile) would lose them all."""
    from hpctrain.launch.container import python_lines
    from hpctrain.site.profile import ContainerSection
    from hpctrain.site.runtimes.base import PY_VAR

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "singularity").symlink_to(FAKE)
    if branch == "apptainer":  # the apptainer branch, but only SingularityCE installed under that name
        (tmp_path / "bin" / "apptainer").write_text(f'#!/bin/bash\nexec {tmp_path / "bin" / "singularity"} "$@"\n')
        (tmp_path / "bin" / "apptainer").chmod(0o755)
    image = tmp_path / "image.sif"
    image.write_bytes(b"fake")
    src = tmp_path / "snap" / "hpctrain"
    src.mkdir(parents=True)
    c = ContainerSection(runtime=branch, image=str(image), source_mount=str(tmp_path / "mnt"))
    code = "import os, json; print(json.dumps(dict(os.environ)))"
    script = "\n".join(["set -eo pipefail", *python_lines(c, [], "python3", str(src)), f'"${{{PY_VAR}[@]}}" -c "$1"'])
    env = {
        "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin",
        "FAKE_APPTAINER_PYTHON": sys.executable,
        "SLURM_PROCID": "1",
        "PYTHONPATH": "/host/module/lib",
    }
    r = subprocess.run(["bash", "-c", script, "job", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    inside = json.loads(r.stdout)
    assert inside["SINGULARITY_CONTAINER"] == str(image) and "APPTAINER_CONTAINER" not in inside
    if branch == "singularity":
        assert inside["SLURM_PROCID"] == "1" and inside["PYTHONNOUSERSITE"] == "1"
        assert inside["PYTHONPATH"].split(":")[0] == str(tmp_path / "mnt")
    else:
        assert "SLURM_PROCID" not in inside and "PYTHONNOUSERSITE" not in inside
        assert str(tmp_path / "mnt") not in inside.get("PYTHONPATH", "")


@pytest.mark.slurm
def test_fake_pyxis_task_starts_in_the_image_named_by_srun_options(slurm_cluster, tmp_path):
    """The property the pyxis launch relies on, through the test cluster's SPANK plugin: with
    --container-image the task runs with the image's environment (its values win over the host's;
    /etc/environment lists them), exactly the --container-mounts given (ro honoured), in
    --container-workdir, and no Slurm client; without the option srun runs tasks as before."""
    assert slurm_cluster.plugstack, "the fake pyxis plugin was not built: apt-get install gcc libslurm-dev"
    image = tmp_path / "image.sqsh"
    image.write_text("PATH=/usr/sbin:/usr/bin:/sbin:/bin\nFROM_IMAGE=1\nLANG=C.UTF-8\n")
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    out.mkdir()
    probe = (
        'echo "path=$PATH image=$FROM_IMAGE lang=$LANG host=${FROM_HOST:-} conf=${SLURM_CONF:-}"; '
        "grep -c FROM_IMAGE /etc/environment; pwd; touch /mnt/ro/x 2>/dev/null || echo ro; "
        "touch /mnt/rw/y && echo rw; scontrol version >/dev/null 2>&1 || echo no-slurm"
    )
    r = slurm_cluster.run(
        "srun",
        "-N1",
        "-n1",
        f"--container-image={image}",
        "--container-env=LANG",
        f"--container-mounts={data}:/mnt/ro:ro,{out}:/mnt/rw",
        f"--container-workdir={out}",
        "bash",
        "-c",
        probe,
        env={"FROM_HOST": "1", "LANG": "de_DE.UTF-8"},
        cwd=tmp_path,
    )
    lines = r.stdout.split()
    assert lines[:5] == ["path=/usr/sbin:/usr/bin:/sbin:/bin", "image=1", "lang=de_DE.UTF-8", "host=1", "conf="]
    assert lines[5:] == ["1", str(out), "ro", "rw", "no-slurm"], r.stdout + r.stderr
    assert (out / "y").exists() and not (data / "x").exists()
    plain = slurm_cluster.run("srun", "-N1", "-n1", "bash", "-c", "scontrol version", cwd=tmp_path)
    assert plain.stdout.startswith("slurm")


@pytest.mark.slurm
def test_fake_pyxis_keeps_each_users_containers_in_their_own_data_path(slurm_cluster, tmp_path):
    """enroot's data path is the job user's own: root's named container on n1 first, then an ordinary
    user's on n1, which runs in the image and is kept under that user's uid. The plugin once named the
    directory by slurmstepd's real uid (root for every job): the user's import was refused in the root-made
    directory and the step ran on the host, which only the image's variables missing from env.json showed."""
    assert slurm_cluster.plugstack, "the fake pyxis plugin was not built: apt-get install gcc libslurm-dev"
    image = tmp_path / "image.sqsh"
    image.write_text("PATH=/usr/sbin:/usr/bin:/sbin:/bin\nFROM_IMAGE=1\n")
    image.chmod(0o644)
    user = slurm_cluster.users.users[0]
    srun = ["srun", "-N1", "-n1", "-w", "n1", f"--container-image={image}"]
    probe = ["bash", "-c", 'echo "image=${FROM_IMAGE:-}"']
    store = runtime_path(slurm_cluster.plugstack)
    made = [store / "0" / "n1" / "pyxis_root-first", store / str(user.uid) / "n1" / "pyxis_user-next"]
    try:
        r = slurm_cluster.run(*srun, "--container-name=root-first", *probe, cwd=tmp_path)
        assert r.stdout.split() == ["image=1"], r.stdout + r.stderr
        u = slurm_cluster.user_run([*srun, "--container-name=user-next", *probe], cwd=tmp_path)
        assert (u.returncode, u.stdout.split()) == (0, ["image=1"]), u.stdout + u.stderr
        assert [p.is_file() for p in made] == [True, True]
        assert made[1].stat().st_uid == user.uid
    finally:
        for p in made:
            p.unlink(missing_ok=True)


@pytest.mark.slurm
@pytest.mark.parametrize("runtime", ["singularity", "pyxis"])
def test_cluster_init_probe_finds_the_runtime_and_runs_the_doctor_in_the_image(slurm_cluster, tmp_path, runtime):
    """`cluster init --probe --image` on the test cluster: SingularityCE (the fake `singularity`, whose
    --version says singularity-ce; no `apptainer`) for a .sif, pyxis (the fake SPANK plugin, which
    `srun --help` lists) for a .sqsh; the profile names that runtime and no module, and the probe's
    doctor ran on a node through it (in the image: SINGULARITY_CONTAINER set; pyxis: its image's PATH,
    where python3 is found)."""
    if runtime == "pyxis":
        assert slurm_cluster.plugstack, "the fake pyxis plugin was not built: apt-get install gcc libslurm-dev"
    bindir, imgbin = tmp_path / "bin", tmp_path / "imgbin"
    bindir.mkdir()
    this_python_as(imgbin / "python3")
    env = {
        "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
        "MODULEPATH": str(tmp_path / "none"),
        "FAKE_APPTAINER_PYTHON": sys.executable,
    }
    if runtime == "singularity":
        (bindir / "singularity").symlink_to(FAKE)
        image = tmp_path / "image.sif"
        image.write_text("a fake SIF")
        env["PATH"] = f"{bindir}:{os.environ['PATH']}"
    else:
        image = tmp_path / "image.sqsh"
        image.write_text(f"PATH={imgbin}:/usr/bin:/bin\n")
    out = tmp_path / "site.yaml"
    r = subprocess.run(
        [sys.executable, "-m", "hpctrain", "cluster", "init", "site", "--probe", "--image", str(image), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=slurm_cluster.environ({"OMP_NUM_THREADS": "1", **env}),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    text = out.read_text()
    prof = yaml.safe_load(text)
    assert prof["container"]["runtime"] == runtime and prof["container_modules"] == []
    assert "# --probe: `hpctrain doctor --json` on a node of the partition saw:" in text
    if runtime == "singularity":
        assert "singularity --version: singularity-ce version 4.1.0" in text and "#   in the image: NCCL" in text
    else:
        assert "srun --help lists --container-image (the pyxis SPANK plugin)" in text

"""Adding a container runtime is one module (and its branch of the batch shell beside it): a runtime
hpctrain does not ship, tests/site/fake_runtime.py, registered and nothing else changed, is a choice
of the profile, is found by `doctor` and `cluster init`, runs the tasks of a batch script, is named
by the short dry run and starts the notebook (docs/runtimes.md, "Adding a runtime")."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from hpctrain import shellfile
from hpctrain.config import ConfigError
from hpctrain.config.io import load
from hpctrain.doctor.container import runtime_checks
from hpctrain.doctor.site_fit import runtime_fit
from hpctrain.launch import dryrun, modules, notebook, submit
from hpctrain.run.source import Snapshot, snapshot_path
from hpctrain.site import cluster_init, runtimes
from hpctrain.site.profile import load_profile
from tests.site import fake_runtime

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "configs" / "clusters" / "local.yaml"
HASH = "0123456789abcdef"


@pytest.fixture
def fakert(tmp_path, monkeypatch):
    """The runtime registered, a stand-in `fakert` on PATH, and a .fimg image."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "fakert").write_text('#!/bin/bash\n[ "$1" = --version ] && echo "fakert version 0.1" && exit 0\nexit 2\n')
    (bindir / "fakert").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    image = tmp_path / "image.fimg"
    image.write_bytes(b"fake")
    with runtimes.registered(fake_runtime.RUNTIME):
        yield image


def script_srun_argv(tmp_path: Path, image: Path) -> tuple[list[str], Path, Path]:
    """The batch script of a 1-node job of the fake runtime, run by bash up to and through its srun
    (a stand-in that records its arguments): srun's argv, the code snapshot and run.dir."""
    prof = load_profile(LOCAL, ["container.runtime=fakert", f"container.image={image}", "container.binds=[/ds:/ds:ro]"])
    runs = tmp_path / "runs"
    cfg = load(None, [f"run.dir={runs}", "run.name=r", f"data.root={tmp_path / 'data'}", "data.global_batch=64"])
    plan = submit.plan_job(cfg, prof, submit.Request(nodes=1, gpus_per_node=2))
    folder = cfg.run_dir / submit.SUBMITIT
    snap = Snapshot(snapshot_path(folder.parent, HASH), HASH)
    script = submit.slurm_script(plan, folder, snap=snap)
    snap.path.mkdir(parents=True)  # where the submission would have put the code snapshot
    bindir = tmp_path / "srun-bin"
    bindir.mkdir()
    (bindir / "srun").write_text('#!/bin/bash\nprintf "%s\\0" "$@" > "$SRUN_ARGS"\n')
    (bindir / "srun").chmod(0o755)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "SLURM_JOB_ID": "42", "SRUN_ARGS": str(tmp_path / "args")}
    run = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    return (tmp_path / "args").read_text().split("\0")[:-1], snap.path, runs


def test_a_runtime_from_its_own_module_runs_the_tasks_of_the_batch_script(tmp_path, fakert):
    argv, snap, runs = script_srun_argv(tmp_path, fakert)
    start = argv.index("fakert")
    assert argv[start:] == [
        "fakert",
        "run",
        "--bind",
        "/ds:/ds:ro",
        "--bind",
        str(tmp_path / "data"),
        "--bind",
        str(runs),
        "--bind",
        f"{snap}:/opt/hpctrain-src/hpctrain:ro",
        str(fakert),
        "python3",
        "-u",
        "-m",
        "hpctrain.launch.task",
        str(runs / "r" / submit.SUBMITIT),
    ]


def test_a_registered_runtime_is_a_profile_choice_and_only_while_registered(fakert):
    prof = load_profile(LOCAL, ["container.runtime=fakert", f"container.image={fakert}"])
    assert prof.container.runtime == "fakert"
    with pytest.raises(ConfigError, match=r"container.image is empty"):
        load_profile(LOCAL, ["container.runtime=fakert"])  # an image runtime needs its image
    assert runtimes.image_kind(str(fakert)) == "fimg" and runtimes.image_kind("/x/y.sif") == "sif"
    assert modules.runtime_commands() == ["apptainer", "singularity", "fakert"]  # checked on PATH after its modules


def test_an_unregistered_runtime_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match=r"fakert.* is not one of apptainer, singularity, pyxis, none"):
        load_profile(LOCAL, ["container.runtime=fakert", "container.image=/x.fimg"])


def test_doctor_and_cluster_init_find_a_registered_runtime(fakert):
    found = {f.runtime: f for f in runtimes.detect()}
    assert found["fakert"].evidence == "fakert --version: fakert version 0.1"
    assert [c.status for c in runtime_checks() if c.name == "runtime fakert"] == ["ok"]
    prof = load_profile(LOCAL, ["container.runtime=fakert", f"container.image={fakert}"])
    fit = runtime_fit(prof, list(found.values()), compute=True)
    assert [(c.status, c.value.split(":")[0]) for c in fit] == [("ok", "fakert (container.runtime)")]
    assert runtimes.choose(list(found.values()), str(fakert)) == ("fakert", found["fakert"])
    part = cluster_init.Partition("gpu", True, "1-00:00:00", ["n1"], False, gpus=8)
    cmd = cluster_init.probe_command(part, image=str(fakert), runtime="fakert", source_mount="/m")
    assert cmd[cmd.index("fakert") :][:4] == ["fakert", "run", "--bind", f"{cluster_init.package_dir()}:/m/hpctrain:ro"]


def test_the_short_dry_run_and_the_notebook_use_a_registered_runtime(tmp_path, fakert):
    prof = load_profile(LOCAL, ["container.runtime=fakert", f"container.image={fakert}"])
    cfg = load(None, [f"run.dir={tmp_path / 'runs'}", "run.name=r", "data.global_batch=64"])
    plan = submit.plan_job(cfg, prof, submit.Request(nodes=1, gpus_per_node=2))
    brief = dryrun.job_brief(plan, f"{dryrun.PYTHON_HOOK} -u -m hpctrain.launch.task F", "/usr/bin/python3")
    assert f"fakert run --bind {tmp_path / 'runs'}" in brief  # the step's command line
    summary = re.escape(shellfile.summary(fake_runtime.BRANCH))
    assert re.search(rf"^fake_runtime\.sh +{summary}$", brief, re.M), brief  # its shell part, named
    job = notebook.NotebookJob(image=str(fakert), runtime="fakert", port=8888, workdir=str(tmp_path))
    notebook.check(job)
    assert notebook.jupyter_command(job, ["jupyter", "lab"]) == f"fakert run {fakert} jupyter lab"


def test_the_fake_runtime_is_only_in_its_own_files():
    """Nothing of hpctrain names it: its module and its shell file are all that added it."""
    named = [
        p.relative_to(ROOT)
        for top in ("src", "configs", "slurm")
        for p in (ROOT / top).rglob("*")
        if p.is_file() and p.suffix in (".py", ".sh", ".yaml", ".sbatch") and "fakert" in p.read_text()
    ]
    assert named == []
    assert fake_runtime.BRANCH.parent == Path(__file__).parent
    r = subprocess.run(["bash", "-n", str(fake_runtime.BRANCH)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

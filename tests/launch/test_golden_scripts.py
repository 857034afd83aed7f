"""Golden batch scripts: the script `hpctrain submit` hands to sbatch for each site shape (and the one
`data pack --slurm` submits), rendered from fixed inputs and compared byte for byte with
tests/launch/golden/<shape>.sbatch, as submitit's tests record the scripts they expect. A change to the
batch shell shows here as a diff to review; when it is the intended one, regenerate them all with

    python -m tests.launch.test_golden_scripts --write

and commit the diff with the change. (slurm/vit.sbatch, the stand-alone script, has its own check:
tests/launch/test_sbatch.py, test_committed_sbatch_is_the_generators_output.)

What would vary between machines or commits is pinned here, in the test only (`pinned`): the host's
Python (sys.executable: where this venv lives), the code snapshot (its hash is the package's source
hash, new at each commit; the path holds it), submitit's version (exported for the task's check),
the call log variable of the environment (HPCTRAIN_SLURM_CALL_LOG, fixed in the script when set),
`sbatch --version` of this machine (spares are refused below Slurm 22.05) and the package directory a
pack job binds (this checkout's path). Profiles are read from configs/clusters/ by path (a user's
profile of the same name would win by name), and the run, data and image paths are absolute paths
that exist nowhere (`absolute_paths` resolves them: nothing for a symlink to change).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest

from hpctrain.config.io import load
from hpctrain.data.prep.pack import PackPlan, ShardJob
from hpctrain.launch import pack_array, submit
from hpctrain.launch import submitit_glue as glue
from hpctrain.launch.sbatch import CALL_LOG_VAR
from hpctrain.run.source import Snapshot, snapshot_path
from hpctrain.site.profile import ClusterProfile, load_profile

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("golden")
CLUSTERS = ROOT / "configs" / "clusters"
REGENERATE = "python -m tests.launch.test_golden_scripts --write"
RUNS = "/golden/runs"  # run.dir of every shape
DATA = "/golden/imagenet"  # data.root
HASH = "0123456789abcdef"  # the code snapshot's source hash (16 hex digits, as run.source.source_hash)
PYTHON = "/usr/bin/python3"  # the host's Python
SUBMITIT = "0.0.0+golden"  # submitit's version
PACKAGE = "/golden/checkout/src/hpctrain"  # the hpctrain package a pack job binds
STAGE_IMAGE = ["container.stage_image=true", "container.stage_image_to=/local/${SLURMD_NODENAME}/$USER"]


def profile(name: str, sets: list[str] = ()) -> ClusterProfile:
    return load_profile(CLUSTERS / f"{name}.yaml", sets)


def training(name: str, prof: ClusterProfile, req: submit.Request, sets: list[str] = ()) -> str:
    """`hpctrain submit`'s script (submit.slurm_script) of run `name` under run.dir RUNS."""
    cfg = load(None, [f"run.dir={RUNS}", f"run.name={name}", f"data.root={DATA}", "data.global_batch=64", *sets])
    plan = submit.plan_job(cfg, prof, req)
    folder = cfg.run_dir / submit.SUBMITIT
    snap = Snapshot(snapshot_path(folder.parent, HASH), HASH)
    return submit.slurm_script(plan, folder, snap=snap)


def sweep(name: str, prof: ClusterProfile, req: submit.Request) -> str:
    """A sweep's array script (sweep.array_plan's fields): element i in its own run directory."""
    cfg = load(None, [f"run.dir={RUNS}", f"run.name={name}", f"data.root={DATA}", "data.global_batch=64"])
    sweep_dir = Path(RUNS) / name
    plan = dataclasses.replace(
        submit.plan_job(cfg, prof, req),
        job_name=name,
        array="0-2%2",
        workdirs=[f"{sweep_dir}/lr=0.001", f"{sweep_dir}/lr=0.003", f"{sweep_dir}/it's b"],
        chdir=str(sweep_dir),
        output=str(sweep_dir / submit.SUBMITIT / "%A_%a_0_log.out"),
    )
    folder = sweep_dir / submit.SUBMITIT
    return submit.slurm_script(plan, folder, "%A_%a", Snapshot(snapshot_path(sweep_dir, HASH), HASH))


def pack(prof: ClusterProfile) -> str:
    """`data pack --slurm`'s array script: 7 shards in 3 groups (the script reads their count only)."""
    shards = tuple(ShardJob(f"train-{i:05d}", f"{DATA}/train", ()) for i in range(7))
    plan = PackPlan(out=Path("/golden/packed"), meta={}, shards=shards, groups=3)
    return pack_array.render(plan, DATA, prof, submit.Request(account="proj x"))


# the site shapes: each container runtime, image staging with hot spares, modules from a profile with
# Lmod paths and a purge, a sweep's job array, nsys, and the pack job
SHAPES: dict[str, Callable[[], str]] = {
    "local-none": lambda: training("local", profile("local"), submit.Request(nodes=2, gpus_per_node=2)),
    "ib-apptainer": lambda: training("ib", profile("example-ib"), submit.Request(nodes=2, gpus_per_node=8)),
    "roce-singularity": lambda: training(
        "roce",
        profile("example-roce", ["container.runtime=singularity", "container.image=/golden/images/x.sif"]),
        submit.Request(nodes=4, gpus_per_node=8, partition="gpu-long"),
    ),
    "ib-pyxis-nsys": lambda: training(
        "pyxis",
        profile("example-ib", ["container.runtime=pyxis", "container.image=/golden/images/x.sqsh"]),
        submit.Request(nodes=2, gpus_per_node=8, nsys_ranks=(0, 8)),
        ["log.profile_steps=20-25"],
    ),
    "ib-apptainer-spares-stage-image": lambda: training(
        "spares",
        profile("example-ib", [*STAGE_IMAGE, "slurm.max_restarts=2"]),
        submit.Request(nodes=2, gpus_per_node=8, spare_nodes=1),
        ["data.stage_to=/local/$USER/stage"],
    ),
    "lmod-modules-host-python": lambda: training(
        "lmod",
        profile(
            "example-ib",
            ["container.runtime=none", "module_use=[/opt/site/modules, '/opt/other modules']", "module_purge=true"],
        ),
        submit.Request(nodes=1, gpus_per_node=4),
    ),
    "roce-apptainer-sweep-array": lambda: sweep("sweep", profile("example-roce"), submit.Request(nodes=1)),
    "pack-array-apptainer": lambda: pack(profile("example-ib")),
}


@contextmanager
def pinned() -> Iterator[None]:
    """What varies by machine or commit, fixed (the module docstring says why each)."""
    env = {k: v for k, v in os.environ.items() if k != CALL_LOG_VAR}
    with (
        mock.patch.object(sys, "executable", PYTHON),
        mock.patch.object(glue, "VERSION", SUBMITIT),
        mock.patch.object(submit, "client_version", lambda: None),
        mock.patch.object(pack_array, "package_dir", lambda: Path(PACKAGE)),
        mock.patch.dict(os.environ, env, clear=True),
    ):
        yield


def rendered(shape: str) -> str:
    with pinned():
        return SHAPES[shape]()


def golden(shape: str) -> Path:
    return GOLDEN / f"{shape}.sbatch"


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_script_is_the_golden_one(shape):
    fresh, path = rendered(shape), golden(shape)
    assert path.is_file(), f"no {path.relative_to(ROOT)}: record it with `{REGENERATE}`"
    recorded = path.read_text()
    if fresh != recorded:
        diff = difflib.unified_diff(
            recorded.splitlines(keepends=True), fresh.splitlines(keepends=True), f"{path.name} (recorded)", "rendered"
        )
        pytest.fail(
            f"the {shape} script differs from {path.relative_to(ROOT)}; if the change is intended, run "
            f"`{REGENERATE}` and commit the diff:\n{''.join(diff)}",
            pytrace=False,
        )


def test_every_golden_file_has_a_shape():
    """A shape renamed or dropped leaves no stale file behind."""
    assert sorted(p.stem for p in GOLDEN.glob("*.sbatch")) == sorted(SHAPES)


def test_rendering_does_not_depend_on_the_machine(monkeypatch):
    """The pins hold: another Python, call log, snapshot hash and submitit version change nothing."""
    monkeypatch.setattr(sys, "executable", "/elsewhere/bin/python")
    monkeypatch.setattr(glue, "VERSION", "9.9.9")
    monkeypatch.setenv(CALL_LOG_VAR, "/elsewhere/calls.jsonl")
    for shape in SHAPES:
        assert rendered(shape) == golden(shape).read_text(), shape


def write() -> None:
    """Record every shape's script (and remove files of shapes no longer listed)."""
    GOLDEN.mkdir(exist_ok=True)
    for stale in set(GOLDEN.glob("*.sbatch")) - {golden(s) for s in SHAPES}:
        stale.unlink()
    for shape in sorted(SHAPES):
        path, text = golden(shape), rendered(shape)
        changed = not path.is_file() or path.read_text() != text
        path.write_text(text)
        print(f"{'wrote' if changed else 'same '} {path.relative_to(ROOT)}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {REGENERATE}")
    write()

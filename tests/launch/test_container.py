"""What the image shows a task: each path it uses at the same path inside, writable where it writes.

Bind computation (container.bind_list) as unit tests, then the script's own Python block run through
the fake `apptainer` (tests/launch/fake_apptainer.sh), which reproduces the property the binds rely
on: a host directory the image does not have (FAKE_APPTAINER_HIDE, like a site's /lustre or
/localscratch) is visible inside only where a --bind puts it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpctrain.errors import LaunchError
from hpctrain.launch.container import bind_list, python_lines
from hpctrain.run.source import source_hash, take_snapshot
from hpctrain.shellfile import node_word as stage_word
from hpctrain.site.profile import ContainerSection
from hpctrain.site.runtimes.base import PY_VAR
from tests.launch.jobs import digits_sets, metrics, submit

FAKE_APPTAINER = Path(__file__).with_name("fake_apptainer.sh")


def binds(*profile: str) -> ContainerSection:
    return ContainerSection(runtime="apptainer", image="/img.sif", binds=list(profile))


def test_destination_mapped_bind_gets_same_path_binds_for_the_jobs_paths():
    """/lustre/proj:/data shows the project at /data only: the run dir and data root under
    /lustre/proj need their own binds, at the paths the task uses."""
    out = bind_list(
        binds("/lustre/proj:/data"), ["/lustre/proj/imagenet", "/lustre/proj/runs/a"], writable=["/lustre/proj/runs/a"]
    )
    assert out == ["/lustre/proj:/data", "/lustre/proj/imagenet", "/lustre/proj/runs/a"]
    # a same-path bind covers what lies under it (no second bind)
    assert bind_list(binds("/lustre:/lustre"), ["/lustre/proj/runs/a"], writable=["/lustre/proj/runs/a"]) == [
        "/lustre:/lustre"
    ]


def test_read_only_same_path_bind_refuses_a_run_dir_under_it():
    c = binds("/datasets:/datasets:ro")
    assert bind_list(c, ["/datasets/imagenet", "/scratch/runs/a"], writable=["/scratch/runs/a"]) == [
        "/datasets:/datasets:ro",
        "/scratch/runs/a",
    ]  # reading under it is fine
    with pytest.raises(LaunchError) as e:
        bind_list(c, ["/datasets/imagenet", "/datasets/runs/a"], writable=["/datasets/runs/a"])
    msg = str(e.value)
    assert "\n" not in msg and "'/datasets:/datasets:ro'" in msg and "read-only" in msg and "run.dir" in msg


def test_path_hidden_by_another_binds_destination_is_refused():
    with pytest.raises(LaunchError, match=r"hidden in the image by the bind '/scratch/x:/lustre'"):
        bind_list(binds("/scratch/x:/lustre"), ["/lustre/proj/runs/a"], writable=["/lustre/proj/runs/a"])


def test_stage_to_word_expands_on_the_node():
    assert stage_word("$TMPDIR/stage") == ('"${TMPDIR}"/stage', ["TMPDIR"])
    assert stage_word("/local/${USER} x") == ("/local/\"${USER}\"' x'", ["USER"])
    assert stage_word("~/s") == ('"${HOME}"/s', ["HOME"])


def run_in_image(
    tmp_path: Path, container: ContainerSection, binds: list[str], code: str, *args: str, env: dict, stage_to: str = ""
) -> subprocess.CompletedProcess:
    """The batch script's Python block, then one task (as srun would start it) running `code`."""
    image = tmp_path / "image.sif"
    if not image.exists():
        image.write_bytes(b"fake")
    (tmp_path / "bin").mkdir(exist_ok=True)
    if not (tmp_path / "bin" / "apptainer").exists():
        (tmp_path / "bin" / "apptainer").symlink_to(FAKE_APPTAINER)
    c = ContainerSection(runtime="apptainer", image=str(image), binds=container.binds, bind_source=False)
    script = "\n".join(
        ["set -eo pipefail", *python_lines(c, binds, "python3", "''", stage_to), f'"${{{PY_VAR}[@]}}" -c "$@"']
    )
    e = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "FAKE_APPTAINER_PYTHON": sys.executable, **env}
    return subprocess.run(["bash", "-c", script, "job", code, *args], capture_output=True, text=True, env=e, timeout=60)


WRITE = "import os, sys; os.makedirs(sys.argv[1], exist_ok=True); open(sys.argv[1] + '/ok', 'w').write('1')"


@pytest.mark.skipif(os.geteuid() != 0, reason="the fake apptainer needs unshare --mount (root)")
def test_run_under_a_destination_mapped_bind_writes_where_the_host_sees_it(tmp_path):
    """Site property: the project file system is bound at another path (/lustre/proj:/data) and is
    not in the image otherwise. The task writes its run dir by the host path: that must reach the host."""
    lustre, data = tmp_path / "lustre", tmp_path / "data"
    run = lustre / "proj" / "runs" / "a"
    run.mkdir(parents=True)
    c = binds(f"{lustre / 'proj'}:{data}")
    r = run_in_image(
        tmp_path,
        c,
        bind_list(c, [str(run)], writable=[str(run)]),
        WRITE,
        str(run),
        env={"FAKE_APPTAINER_HIDE": str(lustre)},
    )
    assert r.returncode == 0, r.stderr
    assert (run / "ok").read_text() == "1"


@pytest.mark.skipif(os.geteuid() != 0, reason="the fake apptainer needs unshare --mount (root)")
def test_stage_to_on_node_local_tmpdir_is_bound_at_run_time(tmp_path):
    """Site property: $TMPDIR is on node-local /localscratch, which Apptainer does not bind by
    default. data.stage_to=$TMPDIR/stage must land on that disk (the host's), not in the image."""
    scratch = tmp_path / "localscratch"
    job_tmp = scratch / "job42"
    job_tmp.mkdir(parents=True)
    r = run_in_image(
        tmp_path,
        binds(),
        [],
        "import os, sys; sys.argv[1] = os.path.expandvars(sys.argv[1]); " + WRITE.split("; ", 1)[1],
        "$TMPDIR/stage",
        stage_to="$TMPDIR/stage",
        env={"FAKE_APPTAINER_HIDE": str(scratch), "TMPDIR": str(job_tmp)},
    )
    assert r.returncode == 0, r.stderr
    assert (job_tmp / "stage" / "ok").read_text() == "1"


@pytest.mark.skipif(os.geteuid() != 0, reason="the fake apptainer needs unshare --mount (root)")
def test_task_sees_an_image_identity_that_changes_when_the_image_is_rebuilt(tmp_path):
    """compile.cache keys its entries by $HPCTRAIN_IMAGE_DIGEST: the task inside the image must
    get one (from the batch shell's stat of the image), the same for the same file, another once the
    file at that path is rebuilt, and a site's own digest left alone."""
    show = "import os; print(os.environ['HPCTRAIN_IMAGE_DIGEST'])"

    def identity(**env) -> str:
        r = run_in_image(tmp_path, binds(), [], show, env=env)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    first = identity()
    assert first.startswith("img") and identity() == first
    image = tmp_path / "image.sif"
    os.utime(image, (1, 1))  # rebuilt in place: same path and size, another mtime
    assert identity() != first
    assert identity(HPCTRAIN_IMAGE_DIGEST="sha256:abc") == "sha256:abc"


@pytest.mark.slurm
def test_job_whose_run_is_under_a_destination_mapped_bind_trains(slurm_cluster, digits_root, tmp_path):
    """Site property: the profile binds the project file system elsewhere (/lustre/proj:/data) and
    the image has no /lustre of its own. A 2-node job with its run dir under /lustre/proj trains, and
    its metrics and checkpoints reach the host."""
    lustre, img = tmp_path / "lustre", tmp_path / "img"
    (lustre / "proj").mkdir(parents=True)
    slurm_cluster.users.share(lustre / "proj")  # the project's directory on it, which the job's user writes
    (img / "bin").mkdir(parents=True)
    (img / "bin" / "apptainer").symlink_to(FAKE_APPTAINER)
    (img / "image.sif").write_bytes(b"fake")
    prof = tmp_path / "site.yaml"
    prof.write_text(
        yaml.safe_dump(
            {
                "name": "site",
                "slurm": {"request_gpus": False, "gpus_per_node": 1, "max_gpus_per_node": 4, "time": "20"},
                "container": {
                    "runtime": "apptainer",
                    "image": str(img / "image.sif"),
                    "source_mount": str(tmp_path / "mnt"),
                    "binds": [f"{lustre / 'proj'}:{tmp_path / 'data'}"],
                },
            }
        )
    )
    env = {
        "PATH": f"{img / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "FAKE_APPTAINER_PYTHON": sys.executable,
        "FAKE_APPTAINER_HIDE": str(lustre),
    }
    runs = lustre / "proj" / "runs"
    job = submit(
        slurm_cluster,
        "--cluster",
        str(prof),
        "--nodes",
        "2",
        *digits_sets(digits_root, runs, "mapped", "train.max_steps=3", "train.eval_every_epochs=0"),
        env=env,
    )
    assert slurm_cluster.wait_done(job, 240) == "COMPLETED"
    assert len(metrics(runs / "mapped", "train")) > 0 and (runs / "mapped" / "checkpoints").is_dir()


IMPORT = "import hpctrain.launch.task, hpctrain.config, hpctrain.run.source as s; print(s.package_dir())"


def attempt(snap: Path, code: str = IMPORT) -> subprocess.CompletedProcess:
    """One attempt's Python block (container.runtime none, the snapshot as HPCTRAIN_SOURCE) and one task
    running `code`, in a login shell's environment: `env -i` (no PYTHONDONTWRITEBYTECODE, which this
    machine exports and a user's shell does not), umask 002."""
    c = ContainerSection(runtime="none", image="")
    lines = python_lines(c, [], shlex.quote(sys.executable), shlex.quote(str(snap)))
    script = "\n".join(["umask 002", "set -eo pipefail", *lines, f'"${{{PY_VAR}[@]}}" -c {shlex.quote(code)}'])
    return subprocess.run(
        ["env", "-i", "PATH=/usr/bin:/bin", "bash", "-c", script], capture_output=True, text=True, timeout=120
    )


def test_tasks_write_no_bytecode_into_the_snapshot_under_umask_002_in_a_clean_environment(tmp_path):
    """Issue 54: under umask 002 the tasks' Python wrote __pycache__ (775) into the snapshot and the
    next attempt refused it. The batch shell's lines export PYTHONDONTWRITEBYTECODE for the tasks: two
    attempts import the snapshot and leave it as hashed. (Root here: the snapshot's 0555 directories
    do not stop root, so the variable alone is under test; the same import without the batch shell's
    lines writes the caches, and the next attempt refuses them in one line.)"""
    project = tmp_path / "project"
    project.mkdir()
    project.chmod(0o2775)  # a group's setgid project tree
    old = os.umask(0o002)
    try:
        snap = take_snapshot(project / "run")
    finally:
        os.umask(old)
    for _ in range(2):  # a requeue runs the same lines again
        r = attempt(snap.path)
        assert r.returncode == 0 and r.stdout.strip() == str(snap.path), r.stderr
        assert not list(snap.path.parent.rglob("__pycache__")) and source_hash(snap.path) == snap.hash
    bare = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(snap.path.parent)}  # the import without those lines
    subprocess.run(["bash", "-c", f"umask 002; exec {shlex.quote(sys.executable)} -c {shlex.quote(IMPORT)}"], env=bare)
    written = sorted(snap.path.rglob("__pycache__"))
    assert written, "the property under test: this Python writes bytecode into the snapshot unless told not to"
    r = attempt(snap.path)
    (line,) = r.stderr.splitlines()
    assert r.returncode == 1 and "/__pycache__: owner uid 0, mode 775)" in line, line  # the refusal


@pytest.mark.skipif(os.geteuid() != 0, reason="the fake apptainer needs unshare --mount (root)")
def test_the_no_bytecode_variable_reaches_a_task_in_the_image(tmp_path):
    """Apptainer's --cleanenv drops the host environment: PYTHONDONTWRITEBYTECODE is on the allow-list."""
    code = "import os; print(os.environ.get('PYTHONDONTWRITEBYTECODE'))"
    r = run_in_image(tmp_path, binds(), [], code, env={})
    assert r.returncode == 0 and r.stdout.strip() == "1", r.stderr

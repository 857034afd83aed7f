"""container.stage_image: the tasks start from a node-local copy of the SIF (apptainer, singularity), or
from one unpacked container per node for the job (pyxis --container-name), not each from the shared image.

The reads are the kernel's count (tests/launch/reads.py: fanotify, every read-only open of the file
by any process); the fake apptainer reads the image it is given, the fake pyxis unpacks (reads) the
image once per node per step unless a container of that name is there already."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpctrain import shellfile
from hpctrain.launch.sbatch import JobPlan, render
from hpctrain.run.source import take_snapshot
from hpctrain.site.profile import load_profile
from hpctrain.site.runtimes.sif import copy_program
from tests.helpers import hpctrain, tails, wait_for
from tests.launch import reads
from tests.launch.pyxis import FAKE_ENROOT, enroot_bin, runtime_path
from tests.slurm_cluster import NODES

ROOT = Path(__file__).resolve().parents[2]
FAKE_APPTAINER = Path(__file__).with_name("fake_apptainer.sh")
SRUN = """#!/bin/bash
# stand-in srun: record the arguments; run the image-staging step's and the training step's command here
n=$(ls "$SRUN_DIR" | wc -l); printf '%s\\0' "$@" > "$SRUN_DIR/$n"
for ((i = 1; i <= $#; i++)); do [ "${!i}" = bash ] && exec "${@:i}"; done
"""


def profile(path: Path, runtime: str, image: Path, **container) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "name": "site",
                "slurm": {"request_gpus": False, "gpus_per_node": 2, "max_gpus_per_node": 2, "time": "10"},
                "container": {"runtime": runtime, "image": str(image), **container},
            }
        )
    )
    return path


@pytest.mark.parametrize("runtime", ["apptainer", "singularity", "pyxis"])
def test_dry_run_with_stage_image_copies_once_per_node_and_tasks_start_from_the_copy(tmp_path, runtime):
    """A dry run's script run by bash with a stand-in srun that runs each step's command here: the
    Apptainer/SingularityCE script first runs a one-task-per-node step that copies the SIF under
    container.stage_image_to (expanded with the node's variables), and the task's `<tool> exec` gets
    that copy in place of the shared image; pyxis gets a per-job --container-name and no copy step."""
    image = tmp_path / ("image.sqsh" if runtime == "pyxis" else "image.sif")
    image.write_bytes(os.urandom(3000))
    prof = profile(
        tmp_path / "site.yaml",
        runtime,
        image,
        stage_image=True,
        stage_image_to=str(tmp_path / "local" / "${SLURMD_NODENAME}"),
    )
    r = hpctrain(
        "submit",
        "--config",
        "configs/digits_vit.yaml",
        "--cluster",
        str(prof),
        "--dry-run=full",
        "--set",
        f"data.root={tmp_path}/data",
        "--set",
        f"run.dir={tmp_path}/runs",
        "--set",
        "run.name=r",
    )
    assert r.returncode == 0, r.stderr
    bindir, calls = tmp_path / "bin", tmp_path / "calls"
    bindir.mkdir()
    calls.mkdir()
    (bindir / "srun").write_text(SRUN)
    (bindir / runtime).write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$TOOL_ARGS"\n')
    for f in bindir.iterdir():
        f.chmod(0o755)
    env = {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURMD_NODENAME": "n1",
        "SRUN_DIR": str(calls),
        "TOOL_ARGS": str(tmp_path / "tool_args"),
    }
    work = tmp_path / "work"
    work.mkdir()
    take_snapshot(tmp_path / "runs" / "r")  # where the dry run's script (fixed at submission) finds the code
    run = subprocess.run(["bash", "-c", r.stdout], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    args = [(calls / str(i)).read_text().split("\0")[:-1] for i in range(len(list(calls.iterdir())))]
    if runtime == "pyxis":  # no copy step; the name: job id, requeue count, image checksum (path, size, mtime)
        st = image.stat()
        cksum = subprocess.run(
            ["cksum"], input=f"{image} {st.st_size} {int(st.st_mtime)}", capture_output=True, text=True
        ).stdout.split()[0]
        assert len(args) == 1 and f"--container-name=hpctrain-42-r0-img{cksum}" in args[0], run.stderr
        return
    assert run.returncode == 0, run.stdout + run.stderr
    stage, train = args
    assert stage[:5] == ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "bash"]
    assert stage[5] == "-c" and stage[7:] == ["hpctrain-stage-image"]
    [local] = (tmp_path / "local" / "n1").glob(f"hpctrain-{os.getuid()}/*-image.sif")
    assert local.parent.stat().st_mode & 0o777 == 0o700  # the user's own directory
    assert local.read_bytes() == image.read_bytes() and int(local.stat().st_mtime) == int(image.stat().st_mtime)
    assert f"hpctrain: staging {image} to {local} on n1: 3.0 kB" in run.stdout
    tool = (tmp_path / "tool_args").read_text().splitlines()
    assert tool[tool.index("python3") - 1] == str(local) and str(image) not in tool
    assert train[train.index("python3") - 1] == str(image)  # the swap happens on the node, per task


def test_stage_image_without_a_runtime_names_the_fix(tmp_path):
    prof = profile(tmp_path / "site.yaml", "none", Path(""), stage_image=True)
    r = hpctrain("submit", "--config", "configs/digits_vit.yaml", "--cluster", str(prof), "--dry-run")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert (
        "container.stage_image copies the image to each node, but container.runtime is none (no image): set "
        "container.stage_image false, or a runtime and its image"
    ) in r.stderr


def test_image_staging_refuses_a_disk_too_small_before_copying(tmp_path):
    """The copier checks the node-local file system's free space first (a 1 MiB tmpfs here) and says
    how much it needs and the ways out, as data.stage_to does; nothing is left behind."""
    image = tmp_path / "image.sif"
    image.write_bytes(os.urandom(2 << 20))
    small = tmp_path / "small"
    small.mkdir()
    prog = f'mount -t tmpfs -o size=1m stage-test {small} && bash -c "$0"'
    r = subprocess.run(
        ["unshare", "--mount", "bash", "-c", prog, copy_program(str(small))],
        capture_output=True,
        text=True,
        env={**os.environ, "HPCTRAIN_IMAGE": str(image), "SLURMD_NODENAME": "n1"},
    )
    if "mount" in r.stderr and r.returncode == 32:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stdout + r.stderr
    assert (
        f"hpctrain: container.stage_image on n1: {small} needs 2097152 bytes (2.1 MB) for {image} but its file "
        "system has 104" in r.stderr  # 1 MiB less the user's directory (a page)
    ), r.stderr
    assert "(1.0 MB) free: point container.stage_image_to at a larger node-local disk" in r.stderr


def test_pyxis_clean_up_removes_only_this_jobs_containers(tmp_path):
    """The per-node program (shell/pyxis_remove.sh) through the fake `enroot` over a data path that also
    holds other jobs' containers (job 4201 beside 42, a user's own names) and pyxis's two scopes'
    names: it removes job 42's (`pyxis_NAME`, `pyxis_42_NAME`), all but the one it is told to keep."""
    data = tmp_path / "data"
    data.mkdir()
    ours = ["pyxis_hpctrain-42-r0-img1", "pyxis_42_hpctrain-42-r0-img1", "pyxis_hpctrain-42-r1-img22"]
    others = ["pyxis_hpctrain-4201-r0-img1", "pyxis_hpctrain-42", "pyxis_42.0", "pyxis_mine", "hpctrain-42-r0-img1"]
    for name in [*ours, *others]:
        (data / name).mkdir()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "enroot").symlink_to(FAKE_ENROOT)
    prog = shellfile.program(["pyxis_remove.sh"])
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "ENROOT_DATA_PATH": str(data), "SLURMD_NODENAME": "n1"}

    def clean(keep: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", prog, "clean", "42", keep], env=env, capture_output=True, text=True)

    r = clean("hpctrain-42-r1-img22")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert sorted(p.name for p in data.iterdir()) == sorted([*others, ours[2]])
    assert r.stdout.splitlines() == [f"hpctrain: removed the pyxis container {c} on n1" for c in sorted(ours[:2])]
    r = clean("")
    assert r.returncode == 0 and sorted(p.name for p in data.iterdir()) == sorted(others), r.stderr


def pyxis_script(tmp_path: Path, command: str) -> str:
    """The generated batch script, container.stage_image under pyxis, the training step `command`."""
    image = tmp_path / "image.sqsh"
    image.write_text("PATH=/usr/bin:/bin\n")
    prof = load_profile(profile(tmp_path / "site.yaml", "pyxis", image, stage_image=True))
    plan = JobPlan(
        profile=prof, job_name="j", nodes=1, tasks_per_node=1, gpus_per_node=0, cpus_per_task=1, mem="0", time="10"
    )
    return render(plan, command, sys.executable, standalone=False)


# stand-ins for a job on node n1: scontrol answers for a RUNNING job; srun runs the clean-up step here
STAND_INS = {
    "scontrol": """#!/bin/bash
case "$1 $2" in
  "show job") echo "JobId=42 JobName=j JobState=RUNNING Restarts=0 NodeList=n1" ;;
  "show hostnames") echo n1 ;;
  *) echo "slurm 22.05.8" ;;
esac
""",
    "srun": SRUN,
    "enroot": '#!/bin/sh\necho "enroot: cannot read $ENROOT_DATA_PATH" >&2; exit 1\n',
}


@pytest.mark.parametrize("how", ["ends", "fails"])
def test_pyxis_clean_up_that_fails_warns_once_and_leaves_the_jobs_exit_alone(tmp_path, how):
    """A batch shell that ends (exit 0) or whose step fails (exit 1) runs the clean-up step as it exits;
    `enroot list` failing there is one warning line on stderr, and the script's exit status is the
    step's, as without the clean-up."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in STAND_INS.items():
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    env = {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "n1",
        "SLURMD_NODENAME": "n1",
        "SRUN_DIR": str(tmp_path / "calls"),
        "HPCTRAIN_MAX_RESTARTS": "0",
    }
    (tmp_path / "calls").mkdir()
    script = pyxis_script(tmp_path, "bash -c true" if how == "ends" else "bash -c false")
    r = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    calls = [
        (tmp_path / "calls" / str(i)).read_text().split("\0")[:-1]
        for i in range(len(os.listdir(work.parent / "calls")))
    ]
    train = [c for c in calls if any(a.startswith("--container-name=hpctrain-42-r0-img") for a in c)]
    clean = [c for c in calls if "hpctrain-pyxis-clean" in c]
    assert len(train) == 1 and len(clean) == 1, r.stdout + r.stderr
    assert clean[0][:6] == [
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        "--ntasks-per-node=1",
        "--nodelist=n1",
        "--kill-on-bad-exit=0",
    ]
    assert clean[0][-3:] == ["hpctrain-pyxis-clean", "42", ""]
    warn = [line for line in r.stderr.splitlines() if "pyxis containers" in line]
    assert warn == [
        "hpctrain: warning: removing job 42's pyxis containers failed (exit 1: hpctrain: n1: enroot list failed: "
        "enroot: cannot read ); what is left stays on the node until removed there ('enroot list' names them: "
        "pyxis_hpctrain-42-*; 'enroot remove -f NAME')"
    ], r.stderr
    assert r.returncode == (0 if how == "ends" else 1), r.stdout + r.stderr


def test_pyxis_container_name_refuses_a_requeue_count_that_is_not_a_number(tmp_path):
    r = subprocess.run(
        ["bash", "-c", pyxis_script(tmp_path, "true")],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "1;x"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and r.stderr == (
        "hpctrain: SLURM_JOB_ID (42) and SLURM_RESTART_COUNT (1;x) name the pyxis container and must be whole "
        "numbers: run the script through sbatch, or unset them\n"
    ), r.stderr


def sbatch(cluster, script: str, path: Path, env: dict) -> str:
    path.write_text(script)
    r = cluster.run(
        "sbatch",
        "--parsable",
        f"--partition={cluster.partition}",
        f"--output={path}.out",
        str(path),
        env=env,
        cwd=path.parent,
    )
    job = r.stdout.strip()
    assert cluster.wait_done(job, 120) == "COMPLETED", Path(f"{path}.out").read_text()
    return Path(f"{path}.out").read_text()


@pytest.mark.slurm
def test_staged_image_is_read_from_the_shared_path_once_per_node_not_once_per_task(slurm_cluster, tmp_path):
    """2 nodes × 2 tasks, each task in the (fake) `apptainer exec`: without staging the shared SIF is
    read 4 times (once per task); with container.stage_image 2 (one copy per node) and each node's
    two tasks read its local copy; a second job finds the copies up to date and reads the shared SIF
    0 times. The batch script is the generated one; the tasks run `python3 -c pass`."""
    why = reads.available()
    if why:
        pytest.skip(why)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "apptainer").symlink_to(FAKE_APPTAINER)
    image = tmp_path / "shared" / "image.sif"
    image.parent.mkdir()
    image.write_bytes(os.urandom(1 << 20))
    local = tmp_path / "local"
    for n in NODES:
        (local / n).mkdir(parents=True)
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "FAKE_APPTAINER_PYTHON": sys.executable}

    def script(name: str, **container) -> str:
        prof = load_profile(profile(tmp_path / f"{name}.yaml", "apptainer", image, **container))
        plan = JobPlan(
            profile=prof, job_name=name, nodes=2, tasks_per_node=2, gpus_per_node=0, cpus_per_task=1, mem="0", time="10"
        )
        return render(plan, '"${HPCTRAIN_PYTHON[@]}" -c pass', sys.executable, standalone=False)

    for n in NODES:  # the user's own directories, made here for the read counter to watch
        (local / n / f"hpctrain-{os.getuid()}").mkdir(mode=0o700)
    counter = reads.Reads(image, *(local / n / f"hpctrain-{os.getuid()}" for n in NODES))
    try:
        sbatch(slurm_cluster, script("plain"), tmp_path / "plain.sh", env)
        shared = [counter.take(image)]
        staged = script("staged", stage_image=True, stage_image_to=f"{local}/$SLURMD_NODENAME")
        out = sbatch(slurm_cluster, staged, tmp_path / "staged.sh", env)
        shared.append(counter.take(image))
        copies = sorted(local.glob(f"*/hpctrain-{os.getuid()}/*-image.sif"))
        assert [c.parent.parent.name for c in copies] == list(NODES), out
        assert [counter.take(c) for c in copies] == [2, 2]  # each node's two tasks read its copy
        assert out.count("hpctrain: staging ") == 2
        again = sbatch(slurm_cluster, staged, tmp_path / "again.sh", env)
        shared.append(counter.take(image))
        assert [counter.take(c) for c in copies] == [2, 2]
        assert again.count("hpctrain: image staging skipped on ") == 2, again
    finally:
        counter.close()
    size = image.stat().st_size
    print(
        f"shared SIF ({size} bytes) reads, 2 nodes x 2 tasks: without staging {shared[0]} "
        f"({shared[0] * size} bytes), staged {shared[1]} ({shared[1] * size} bytes), staged again {shared[2]}"
    )
    assert shared == [4, 2, 0]
    assert all(c.read_bytes() == image.read_bytes() for c in copies)  # read here after the count


@pytest.mark.slurm
def test_pyxis_container_name_unpacks_the_image_once_per_node_for_the_job(slurm_cluster, tmp_path):
    """Through the fake pyxis plugin: an unnamed container is unpacked (the image read) on each node at
    every step; with --container-name the first step unpacks it once per node and the second step
    reuses it (0 reads), its tasks still in the image."""
    assert slurm_cluster.plugstack, "the fake pyxis plugin was not built: apt-get install gcc libslurm-dev"
    why = reads.available()
    if why:
        pytest.skip(why)
    image = tmp_path / "image.sqsh"
    image.write_text("PATH=/usr/sbin:/usr/bin:/sbin:/bin\nFROM_IMAGE=1\n")
    counter = reads.Reads(image)
    got = []
    try:
        named = [f"--container-name=hpctrain-{tmp_path.name}"]
        for extra in ([], [], named, named):
            r = slurm_cluster.run(
                "srun",
                "-N2",
                "-n4",
                f"--container-image={image}",
                *extra,
                "bash",
                "-c",
                'echo "$FROM_IMAGE"',
                cwd=tmp_path,
            )
            assert r.stdout.split() == ["1"] * 4, r.stdout + r.stderr
            got.append(counter.take(image))
    finally:
        counter.close()
    assert got == [2, 2, 2, 0]


# the training step's task: which attempt, node and image build it runs; the first attempt waits (for a requeue)
BUILD_TASK = (
    'bash -c \'echo "attempt=${SLURM_RESTART_COUNT:-0} node=$SLURMD_NODENAME image=$IMAGE_BUILD"; '
    '[ "${SLURM_RESTART_COUNT:-0}" != 0 ] || exec sleep 600\''
)


@pytest.mark.slurm
@pytest.mark.parametrize("requeue", ["scontrol", "shell"])
def test_pyxis_requeue_after_an_image_rebuild_runs_the_new_image_and_leaves_no_container(
    slurm_cluster, tmp_path, requeue
):
    """The generated batch script with container.stage_image under the fake pyxis (named containers kept
    as pyxis_NAME under its runtime_path, as pyxis's default container_scope=global keeps them in enroot's
    data path; the fake `enroot list|remove` on the job's PATH). Attempt 0 unpacks the old image on both
    nodes; the image is rebuilt at the same path and the job requeued, by a site's `scontrol requeue`
    or by the batch shell itself (a time limit's USR2 to it: the tasks end, it requeues): attempt 1, on
    the same nodes, runs the new image on every node (a name per job id alone would hand it the old
    rootfs); attempt 0's containers are removed (by the shell before its own requeue, else at attempt
    1's start: Slurm's requeue ended attempt 0's steps), and when the job ends nothing it named is left."""
    assert slurm_cluster.plugstack, "the fake pyxis plugin was not built: apt-get install gcc libslurm-dev"
    image = tmp_path / "image.sqsh"
    image.write_text("PATH=/usr/sbin:/usr/bin:/sbin:/bin\nIMAGE_BUILD=old\n")
    prof = load_profile(profile(tmp_path / "site.yaml", "pyxis", image, stage_image=True))
    plan = JobPlan(
        profile=prof,
        job_name="pyxis-rq",
        nodes=2,
        tasks_per_node=1,
        gpus_per_node=0,
        cpus_per_task=1,
        mem="0",
        time="10",
    )
    script, out = tmp_path / "job.sh", tmp_path / "job.out"
    script.write_text(render(plan, BUILD_TASK, sys.executable, standalone=False))
    env = {"PATH": f"{enroot_bin(slurm_cluster.plugstack)}:{os.environ['PATH']}"}
    r = slurm_cluster.run(
        "sbatch",
        "--parsable",
        f"--partition={slurm_cluster.partition}",
        f"--output={out}",
        str(script),
        env=env,
        cwd=tmp_path,
    )
    job = r.stdout.strip()
    runs = runtime_path(slurm_cluster.plugstack) / str(os.getuid())  # this user's containers

    def show() -> str:
        rows = slurm_cluster.run("sacct", "-n", "-P", "-D", "-j", job, "-o", "JobID,State,NodeList", check=False)
        left = sorted(p.relative_to(runs).as_posix() for p in runs.glob(f"*/pyxis_hpctrain-{job}-*"))
        return f"sacct: {rows.stdout.strip()}\ncontainers: {left}\n{tails([out], 40)}"

    def lines(attempt: int) -> list[str]:
        text = out.read_text() if out.exists() else ""
        return sorted(line for line in text.splitlines() if line.startswith(f"attempt={attempt} "))

    first = wait_for(lambda: len(lines(0)) == 2 and lines(0), "attempt 0's tasks on both nodes", show=show)
    assert first == ["attempt=0 node=n1 image=old", "attempt=0 node=n2 image=old"], show()
    old = sorted(p.relative_to(runs).as_posix() for p in runs.glob(f"*/pyxis_hpctrain-{job}*"))
    assert [o.split("/")[0] for o in old] == ["n1", "n2"], show()  # one unpacked container per node
    mtime = image.stat().st_mtime
    image.write_text("PATH=/usr/sbin:/usr/bin:/sbin:/bin\nIMAGE_BUILD=new\n")  # rebuilt in place, later
    os.utime(image, (mtime + 60, mtime + 60))
    if requeue == "scontrol":
        slurm_cluster.run("scontrol", "requeue", job)
    else:
        slurm_cluster.run("scancel", "--batch", "--signal=USR2", job)
    assert slurm_cluster.wait_done(job, 180) == "COMPLETED", show()
    text = out.read_text()
    assert lines(1) == ["attempt=1 node=n1 image=new", "attempt=1 node=n2 image=new"], show()
    for o in old:  # removed before the shell's requeue, or at attempt 1's start
        node, name = o.split("/")
        assert name.startswith(f"pyxis_hpctrain-{job}-r0-img"), old
        assert f"hpctrain: removed the pyxis container {name} on {node}" in text, show()
    assert "r1-img" in text and "warning" not in text, show()  # and its own at its end
    assert not list(runs.glob(f"*/pyxis_hpctrain-{job}-*")), show()

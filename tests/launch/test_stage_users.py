"""container.stage_image on nodes that other users share (docs/runtimes.md, "Staging the image"): each
user's copies live in a directory of their own under the staging directory (`<dir>/hpctrain-<uid>`,
0700); where it is another user's or others can write it the copier skips staging on that node with
one line (the job goes on, that node's tasks read the shared image), and a task starts from the copy
only once it has checked it (this uid's file, the shared image's size, mtime and identity); otherwise
it reads the shared image and says why.

On the Slurm test cluster, two Unix users made here (useradd) share one site image and a sticky,
world-writable staging directory as /tmp is: the second user's job stages its own copy beside the
first's, and a file the first user plants where the second's copy goes never runs in the second's tasks
(that node skips staging; the job completes on the shared image).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hpctrain.launch.sbatch import JobPlan, render
from hpctrain.site.profile import load_profile
from hpctrain.site.runtimes.sif import cleanenv_wrapper, copy_program
from tests.launch.test_stage_image import profile
from tests.slurm_cluster import NODES, SlurmCluster, missing

OTHER_UID = 54321  # a uid no one here has: "another user"


def plant_unsafe(udir: Path, case: str, elsewhere: Path) -> None:
    """Put at the user's directory `udir` what another user could have left there first: `case` is
    "other user's" (OTHER_UID's), "group-writable" (770) or "a symlink" (to `elsewhere`, 0700)."""
    if case == "a symlink":
        elsewhere.mkdir(mode=0o700)
        udir.symlink_to(elsewhere)
    else:
        udir.mkdir()
        udir.chmod(0o770 if case == "group-writable" else 0o755)
        if case == "other user's":
            os.chown(udir, OTHER_UID, -1)


def stage(image: Path, to: Path, **env: str) -> subprocess.CompletedProcess:
    """The copier, run here as node n1."""
    return subprocess.run(
        ["bash", "-c", copy_program(str(to)), "hpctrain-stage-image"],
        capture_output=True,
        text=True,
        env={**os.environ, "HPCTRAIN_IMAGE": str(image), "SLURMD_NODENAME": "n1", **env},
    )


def task_image(image: Path, to: Path, **env: str) -> tuple[str, str]:
    """The image a task's `<tool> exec` gets (the per-task wrapper, `echo` standing in for the tool),
    and what the wrapper said."""
    prog = cleanenv_wrapper(stage_image_to=str(to))
    r = subprocess.run(
        ["bash", "-c", prog, "hpctrain-task", "echo", "exec", "--bind", str(image), str(image), "python3"],
        capture_output=True,
        text=True,
        env={**os.environ, "HPCTRAIN_IMAGE": str(image), **env},
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.split()[-2], r.stderr


def test_the_copy_goes_in_a_private_directory_and_the_task_checks_it_before_use(tmp_path):
    """The copy is <dir>/hpctrain-<uid>/<cksum>-<name> in a 0700 directory of this uid; a task takes
    it while it is this uid's copy of the image, and reads the shared image, saying why, once the
    copy belongs to another uid, has another mtime, or another identity."""
    image = tmp_path / "image.sif"
    image.write_bytes(os.urandom(4000))
    to = tmp_path / "tmp"
    r = stage(image, to)
    assert r.returncode == 0, r.stderr
    udir = to / f"hpctrain-{os.getuid()}"
    [copy] = udir.glob("*-image.sif")
    assert udir.stat().st_mode & 0o777 == 0o700 and udir.stat().st_uid == os.getuid()
    assert copy.read_bytes() == image.read_bytes()
    assert task_image(image, to) == (str(copy), "")
    mtime = copy.stat().st_mtime
    os.chown(copy, OTHER_UID, -1)  # e.g. planted by another user: not ours
    used, said = task_image(image, to)
    assert used == str(image) and f"is not this uid's copy of {image}" in said, said
    assert said.startswith("hpctrain: not using the staged image on ") and said.count("\n") == 1
    os.chown(copy, os.getuid(), -1)
    os.utime(copy, (mtime + 60, mtime + 60))
    assert task_image(image, to)[0] == str(image)
    os.utime(copy, (mtime, mtime))
    Path(f"{copy}.id").write_text("img1\n")  # another image's identity
    used, said = task_image(image, to)
    assert used == str(image) and "does not hold the image identity img" in said, said
    r = stage(image, to)  # the copier sees it too, and copies again
    assert r.returncode == 0 and "hpctrain: staging " in r.stdout, r.stderr
    assert task_image(image, to) == (str(copy), "")


@pytest.mark.parametrize("case", ["other user's", "group-writable", "a symlink"])
def test_the_copier_skips_a_user_directory_it_does_not_own_alone(tmp_path, case):
    """A directory at the user's path that another uid made first (anyone can, in /tmp), that the
    group or others can write, or a symlink: staging on that node is skipped with one line naming
    the reason and the fix, and the copier succeeds (exit 0, report "skip ..."), so the job goes on;
    nothing is copied into it, and that node's tasks read the shared image (silently where the batch
    shell lists the node as skipped: the copier said why once)."""
    image = tmp_path / "image.sif"
    image.write_bytes(os.urandom(4000))
    to = tmp_path / "tmp"
    udir = to / f"hpctrain-{os.getuid()}"
    to.mkdir()
    plant_unsafe(udir, case, tmp_path / "elsewhere")
    reports = tmp_path / "reports"
    reports.mkdir()
    r = stage(image, to, HPCTRAIN_STAGE_REPORT=str(reports))
    assert r.returncode == 0 and r.stdout == "" and r.stderr.count("\n") == 1, r.stdout + r.stderr
    why = {
        "other user's": f"{udir} belongs to uid {OTHER_UID}, not to this job's uid {os.getuid()}",
        "group-writable": f"{udir} is group- or other-writable (mode 770)",
        "a symlink": f"{udir} is not a directory",
    }[case]
    assert r.stderr == (
        f"hpctrain: image staging skipped on n1: {why}: the staged image must be in a directory only you can "
        f"write, so this node's tasks read {image}; to stage there, have {udir} removed (its owner or root), "
        "or point container.stage_image_to at a directory of your own\n"
    )
    assert (reports / "n1").read_text().startswith(f"skip {why}: ")
    assert not list(tmp_path.rglob("*-image.sif"))
    used, said = task_image(image, to, SLURMD_NODENAME="n1")  # not listed as skipped: it says why itself
    assert used == str(image) and said.startswith("hpctrain: not using the staged image on "), said
    assert task_image(image, to, SLURMD_NODENAME="n1", HPCTRAIN_STAGE_SKIP="n0 n1 ") == (str(image), "")


# A stand-in `apptainer exec` for jobs of users other than root (fake_apptainer.sh needs root for its
# mount namespace): it records which uid's task was given which image file, and that file's checksum.
RECORDING_APPTAINER = """#!/bin/bash
while [ $# -gt 0 ]; do case $1 in exec|--nv|--cleanenv) shift ;; --bind|-B|--env) shift 2 ;; *) break ;; esac; done
printf '%s %s %s\\n' "$(id -u)" "$1" "$(sha256sum < "$1" | cut -c1-64)" > "$FAKE_LOG/$(id -u)-$SLURMD_NODENAME"
"""


def add_user(name: str) -> tuple[int, int]:
    subprocess.run(["useradd", "-M", "-N", "-g", "users", "-s", "/bin/bash", name], check=True, capture_output=True)
    pw = subprocess.run(["id", "-u", name], check=True, capture_output=True, text=True).stdout.strip()
    return int(pw), int(subprocess.run(["id", "-g", name], check=True, capture_output=True, text=True).stdout)


@pytest.fixture
def users_cluster():
    """A Slurm test cluster whose files every user can reach (the session's lives under pytest's 0700
    basetemp, which another user's sbatch could not read nor its munge socket reach), and two Unix
    users of the group `users`, removed afterwards. Skipped without useradd."""
    why = missing()
    if why:
        pytest.skip(why)
    if not shutil.which("useradd") or not shutil.which("setpriv"):
        pytest.skip("useradd and setpriv (passwd, util-linux) are needed to make and act as a second user")
    base = Path(tempfile.mkdtemp(prefix="hpctrain-users-", dir="/tmp"))
    base.chmod(0o755)
    names = [f"hpct{c}{secrets.token_hex(3)}" for c in "ab"]
    made = []
    cluster = None
    try:
        for n in names:
            made.append((n, *add_user(n)))
        cluster = SlurmCluster(base / "slurm").start()
        yield cluster, base, made
    finally:
        if cluster is not None:
            cluster.stop()
        for n, *_ in made:
            subprocess.run(["userdel", n], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slurm
def test_two_users_stage_one_site_image_each_into_their_own_copy(users_cluster):
    """Users A and B, one site image (0644), a staging directory per node that is sticky and
    world-writable as /tmp is. A's job stages; B's job then stages its own copy beside A's and its
    tasks run it (today B's copier dies on A's lock file: one name for everyone). A cannot write into
    B's directory; on a node where B has none yet, a directory A made there first, holding a file of
    the image's size, mtime and identity, is not used by B's copier: staging on that node is skipped
    with one line saying why, B's job completes, its task there reads the shared image and never A's
    file (before: the job FAILED)."""
    cluster, base, [(a, uid_a, gid), (b, uid_b, _)] = users_cluster
    image = base / "site" / "image.sif"
    image.parent.mkdir()
    image.write_bytes(os.urandom(1 << 20))
    image.chmod(0o644)
    (base / "bin").mkdir()
    (base / "bin" / "apptainer").write_text(RECORDING_APPTAINER)
    (base / "bin" / "apptainer").chmod(0o755)
    log = base / "log"
    log.mkdir()
    log.chmod(0o1777)
    local = base / "local"
    for n in NODES:
        (local / n).mkdir(parents=True)
        (local / n).chmod(0o1777)  # as /tmp
    prof = load_profile(
        profile(base / "site.yaml", "apptainer", image, stage_image=True, stage_image_to=f"{local}/$SLURMD_NODENAME")
    )
    plan = JobPlan(
        profile=prof, job_name="users", nodes=2, tasks_per_node=1, gpus_per_node=0, cpus_per_task=1, mem="0", time="10"
    )
    script = render(plan, '"${HPCTRAIN_PYTHON[@]}" -c pass', sys.executable, standalone=False)
    env = {"PATH": f"{base / 'bin'}:{os.environ['PATH']}", "FAKE_LOG": str(log)}
    site_sum = hashlib.sha256(image.read_bytes()).hexdigest()

    def as_user(user: str, uid: int, *cmd: str, **kw) -> subprocess.CompletedProcess:
        return cluster.run("setpriv", f"--reuid={uid}", f"--regid={gid}", "--init-groups", "--", *cmd, **kw)

    def job(user: str, uid: int, name: str) -> tuple[str, str]:
        run = base / name
        run.mkdir()
        os.chown(run, uid, gid)
        (run / "job.sh").write_text(script)
        r = as_user(
            user,
            uid,
            "sbatch",
            "--parsable",
            f"--partition={cluster.partition}",
            f"--output={run}/job.out",
            str(run / "job.sh"),
            env={**env, "HOME": str(run)},
            cwd=run,
        )
        state = cluster.wait_done(r.stdout.strip(), 120)
        return state, (run / "job.out").read_text()

    def ran(uid: int) -> dict[str, tuple[str, str]]:
        """node → (the image file B's task was given, its checksum)"""
        out = {}
        for f in log.glob(f"{uid}-*"):
            _, path, digest = f.read_text().split()
            out[f.name.split("-", 1)[1]] = (path, digest)
            f.unlink()
        return out

    state, out = job(a, uid_a, "a1")
    assert state == "COMPLETED", out
    a_copies = {n: next((local / n / f"hpctrain-{uid_a}").glob("*-image.sif")) for n in NODES}
    assert ran(uid_a) == {n: (str(a_copies[n]), site_sum) for n in NODES}, out
    state, out = job(b, uid_b, "b1")
    assert state == "COMPLETED", out  # today: "cannot write .../hpctrain-<cksum>-image.sif.lock"
    b_dirs = {n: local / n / f"hpctrain-{uid_b}" for n in NODES}
    b_copies = {n: next(b_dirs[n].glob("*-image.sif")) for n in NODES}
    assert all(b_dirs[n].stat().st_uid == uid_b and b_dirs[n].stat().st_mode & 0o777 == 0o700 for n in NODES)
    assert ran(uid_b) == {n: (str(b_copies[n]), site_sum) for n in NODES}, out
    assert out.count("hpctrain: staging ") == 2, out

    # A plants a file where B's copy goes: refused in B's own directory...
    evil = base / "evil.sif"
    evil.write_bytes(os.urandom(1 << 20))
    os.utime(evil, (image.stat().st_atime, image.stat().st_mtime))
    os.chmod(evil, 0o644)
    r = as_user(a, uid_a, "cp", "-p", str(evil), str(b_copies["n1"]), check=False)
    assert r.returncode != 0 and "Permission denied" in r.stderr, r.stderr
    # ...and on a node where B has no directory yet (B's copies there gone, e.g. a rebooted node), A makes it
    shutil.rmtree(b_dirs["n2"])
    plant = f"""umask 022; mkdir -m 755 {b_dirs["n2"]} && cp -p {evil} {b_copies["n2"]} &&
cp {a_copies["n2"]}.id {b_copies["n2"]}.id"""  # the image's identity: A's copy has the same
    r = as_user(a, uid_a, "bash", "-c", plant, check=False)
    assert r.returncode == 0, r.stderr
    state, out = job(b, uid_b, "b2")
    evil_sum = hashlib.sha256(evil.read_bytes()).hexdigest()
    assert state == "COMPLETED", out  # before: FAILED, "n2: image staging failed (... belongs to uid ...)"
    why = f"{b_dirs['n2']} belongs to uid {uid_a}, not to this job's uid {uid_b}"
    assert out.count(why) == 1 and f"hpctrain: image staging skipped on n2: {why}: " in out, out
    said = [ln for ln in out.splitlines() if ln.startswith("hpctrain: not using the staged image on ")]
    assert not [ln for ln in said if "$(hostname)" not in ln], out  # n2's tasks: silent (the log holds the script)
    assert ran(uid_b) == {"n1": (str(b_copies["n1"]), site_sum), "n2": (str(image), site_sum)}, out
    assert evil_sum != site_sum

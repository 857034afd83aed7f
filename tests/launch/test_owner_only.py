"""What the batch shell runs or writes through as the job's user is ours alone (run.owner): the
control directory `.hpctrain/` (stops.sh: the shell appends faults-, stop-, bad-nodes- files there)
and the code snapshot the tasks import before they check its hash (source.sh). Here the shell
parts run in bash, as inlined, on real directories; the test runs as root, so "another user" is a
chown."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from hpctrain import shellfile
from hpctrain.errors import LaunchError
from hpctrain.run.source import take_snapshot

SRC = Path(__file__).resolve().parents[2] / "src" / "hpctrain"
ENV = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7"}


def run_part(part: str, cwd: Path, env: dict[str, str], umask: int = 0o022) -> subprocess.CompletedProcess:
    script = "\n".join([f"umask {umask:03o}", "set -eo pipefail", shellfile.program([part]), "echo passed"])
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_control_dir_is_made_owner_only_under_umask_002(tmp_path):
    tmp_path.chmod(0o2775)  # a group's shared project directory
    r = run_part("stops.sh", tmp_path, ENV, umask=0o002)
    assert r.returncode == 0 and r.stdout.strip() == "passed", r.stderr
    assert stat.S_IMODE((tmp_path / ".hpctrain").stat().st_mode) & 0o777 == 0o755  # setgid is inherited


def test_control_dir_another_user_can_change_is_refused(tmp_path):
    ctl = tmp_path / ".hpctrain"
    ctl.mkdir()
    ctl.chmod(0o775)  # made by an earlier version under umask 002
    r = run_part("stops.sh", tmp_path, ENV)
    assert r.returncode == 1 and "passed" not in r.stdout
    (line,) = r.stderr.splitlines()
    assert f"{ctl} can be changed by another user (owner uid 0, mode 775)" in line and "chmod 755" in line, line
    ctl.chmod(0o755)
    os.chown(ctl, 4242, -1)
    r = run_part("stops.sh", tmp_path, ENV)
    assert r.returncode == 1 and "(owner uid 4242, mode 755)" in r.stderr, r.stderr
    os.chown(ctl, 0, -1)
    assert run_part("stops.sh", tmp_path, ENV).returncode == 0
    ctl.rmdir()
    (tmp_path / "elsewhere").mkdir()
    ctl.symlink_to(tmp_path / "elsewhere")  # a link planted while the directory was open to others
    r = run_part("stops.sh", tmp_path, ENV)
    assert r.returncode == 1 and "can be changed by another user" in r.stderr, r.stderr


def test_snapshot_another_user_can_change_is_refused_before_the_tasks_start(tmp_path):
    snap = take_snapshot(tmp_path / "run", SRC)
    env = {**ENV, "HPCTRAIN_SOURCE": str(snap.path)}
    r = run_part("source.sh", tmp_path, env)
    assert r.returncode == 0 and r.stdout.strip() == "passed", r.stderr
    entry = snap.path / "train" / "entry.py"
    entry.chmod(0o664)  # a group member could rewrite it
    r = run_part("source.sh", tmp_path, env)
    (line,) = r.stderr.splitlines()
    assert r.returncode == 1 and f"({entry}: owner uid 0, mode 664)" in line and "remove " in line, line
    entry.chmod(0o444)
    code = tmp_path / "run" / "code"
    os.chown(code, 4242, -1)  # whoever owns code/ can rename the snapshot away and put another in
    r = run_part("source.sh", tmp_path, env)
    assert r.returncode == 1 and f"({code}: owner uid 4242" in r.stderr, r.stderr
    os.chown(code, 0, -1)
    checkout_source = {**ENV, "HPCTRAIN_SOURCE": str(SRC)}  # the stand-alone script's live checkout: not checked
    assert run_part("source.sh", tmp_path, checkout_source).returncode == 0


def unsealed(path: Path) -> Path:
    """`path`'s directory made writable again (a snapshot's are 0555), as a planter's would be."""
    path.parent.chmod(0o755)
    return path


@pytest.mark.parametrize(
    "plant",
    [
        "hpctrain/train/__pycache__/entry.cpython-311.pyc",  # Python prefers it to entry.py when its header matches
        "hpctrain/train/entry.pyc",  # a sourceless module
        "hpctrain/train/entry.cpython-311-x86_64-linux-gnu.so",  # an extension module, preferred to both
        "torch.py",  # beside the package: first on the tasks' PYTHONPATH (container.runtime none)
    ],
)
def test_a_file_the_hash_does_not_cover_is_refused_by_the_shell_and_at_submission(tmp_path, plant):
    """What Python could import from the snapshot is what its hash covers: anything else planted in it,
    even by the job's own user, stops the attempt in one line before any task starts, and the next
    submission of the same code too."""
    run = tmp_path / "run"
    snap = take_snapshot(run, SRC)
    env = {**ENV, "HPCTRAIN_SOURCE": str(snap.path)}
    p = snap.path.parent / plant
    p.parent.mkdir(exist_ok=True)
    unsealed(p).write_bytes(b"\0")
    r = run_part("source.sh", tmp_path, env)
    (line,) = r.stderr.splitlines()
    assert r.returncode == 1 and "passed" not in r.stdout, line
    assert f"({p.parent if p.parent.name == '__pycache__' else p}: not a source file of the snapshot" in line, line
    assert f"chmod -R u+w {snap.path.parent} && rm -r {snap.path.parent}" in line, line
    with pytest.raises(LaunchError, match=r"is not a source file of the snapshot, which its hash would not cover"):
        take_snapshot(run, SRC)


def test_snapshot_under_a_directory_every_user_may_write_is_refused(tmp_path):
    """A directory above the snapshot that any user may write without the sticky bit lets them rename
    the way to it and put their own in place: refused. A group's setgid project tree (2775) and a
    sticky world-writable one (/tmp's 1777) are not."""
    project = tmp_path / "project"
    project.mkdir()
    project.chmod(0o2775)
    snap = take_snapshot(project / "run", SRC)
    env = {**ENV, "HPCTRAIN_SOURCE": str(snap.path)}
    assert run_part("source.sh", tmp_path, env).returncode == 0
    project.chmod(0o1777)
    assert run_part("source.sh", tmp_path, env).returncode == 0
    take_snapshot(project / "run", SRC)
    project.chmod(0o777)
    r = run_part("source.sh", tmp_path, env)
    (line,) = r.stderr.splitlines()
    assert r.returncode == 1 and f"({project}: mode 777, every user may rename what is in it" in line, line
    assert f"chmod o-w (or +t) {project}" in line, line
    with pytest.raises(LaunchError, match=f"{project}: mode 777, every user may rename"):
        take_snapshot(project / "run", SRC)


def test_the_tasks_get_the_resolved_path(tmp_path):
    """A link on the way to the snapshot is resolved once per attempt: the path the tasks import and the
    image binds is the real one, so a link changed later cannot send them elsewhere."""
    snap = take_snapshot(tmp_path / "real", SRC)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    env = {**ENV, "HPCTRAIN_SOURCE": str(tmp_path / "link" / "code" / snap.hash / "hpctrain")}
    script = "\n".join(["set -eo pipefail", *shellfile.lines("source.sh"), 'echo "$HPCTRAIN_SOURCE"'])
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == str(snap.path), r.stderr


def test_an_in_job_restart_checks_the_snapshot_again(tmp_path):
    """Each step of the batch shell's loop (step_start.sh) checks the snapshot: the restart of a failed
    step imports it again, so a .pyc planted since the attempt started stops the job there."""
    snap = take_snapshot(tmp_path / "run", SRC)
    state = ["hpctrain_alloc=n1", "hpctrain_spares=0", "hpctrain_attempt=1", f"HPCTRAIN_STOP_FILE={tmp_path}/stop"]
    step = [*shellfile.lines("step_start.sh"), "for hpctrain_i in 1 2; do", "  hpctrain_step_start || break"]
    step.append('  echo "step $hpctrain_i"')
    plant = snap.path / "train" / "__pycache__"
    script = "\n".join(
        ["set -eo pipefail", *shellfile.lines("source.sh"), *state, *step, f"  mkdir -p {plant}", "done"]
    )
    unsealed(plant)
    r = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env={**ENV, "HPCTRAIN_SOURCE": str(snap.path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and r.stdout.split() == ["step", "1"], r.stdout + r.stderr
    (line,) = r.stderr.splitlines()
    assert f"({plant}: not a source file of the snapshot" in line, line


def test_a_linked_package_keeps_its_name(tmp_path):
    """slurm/vit.sbatch's HPCTRAIN_SOURCE may be a link named hpctrain to a copy named otherwise: the
    directories above it are resolved, the name Python imports stays."""
    (tmp_path / "copy-1").mkdir()
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "hpctrain").symlink_to(tmp_path / "copy-1")
    (tmp_path / "up").symlink_to(tmp_path / "real")
    script = "\n".join(["set -eo pipefail", *shellfile.lines("source.sh"), 'echo "$HPCTRAIN_SOURCE"'])
    env = {**ENV, "HPCTRAIN_SOURCE": f"{tmp_path}/up/hpctrain/"}
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"{tmp_path}/real/hpctrain", r.stderr

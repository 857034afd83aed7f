"""The submitit folder (pickles every task unpickles at each start) is private to the job's user,
also in a setgid project directory under umask 002, and a task refuses a pickle another user can
write (real files and modes; the test runs as root, so "another user" is a chown)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import hpctrain
from hpctrain.launch import task
from hpctrain.launch.private import private_dir, writable_by_others
from hpctrain.train import stop

SLURM_TASK = {
    "SUBMITIT_EXECUTOR": "slurm",
    "SLURM_JOB_ID": "5",
    "SLURM_PROCID": "0",
    "SLURM_NTASKS": "1",
    "SLURM_JOB_NUM_NODES": "1",
    "SLURM_NODEID": "0",
    "SLURM_LOCALID": "0",
}


def mode(p) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_submitit_folder_is_0700_in_a_setgid_project_dir_under_umask_002(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    project.chmod(0o2775)  # a group's shared directory
    old = os.umask(0o002)
    try:
        folder = private_dir(project / "runs" / "r1" / "submitit")
        (project / "runs" / "r2" / "submitit").mkdir(parents=True)  # a run submitted before the change
        again = private_dir(project / "runs" / "r2" / "submitit")
    finally:
        os.umask(old)
    assert mode(folder) == 0o700 and mode(again) == 0o700


def test_pickle_another_user_can_write_is_named(tmp_path):
    folder = private_dir(tmp_path / "submitit")
    pkl = folder / "5_submitted.pkl"
    pkl.write_bytes(b"x")
    pkl.chmod(0o664)  # umask 002: harmless while nobody else can enter the folder
    assert writable_by_others(pkl) is None
    folder.chmod(0o755)
    assert "is writable by another user (owner uid 0, mode 0664)" in writable_by_others(pkl)
    pkl.chmod(0o644)
    os.chown(pkl, 4242, -1)
    assert "owner uid 4242" in writable_by_others(pkl)
    folder.chmod(0o775)
    assert "writable by its group or others (mode 0775)" in writable_by_others(pkl)
    os.chown(folder, 4242, -1)
    assert "belongs to uid 4242" in writable_by_others(pkl)


def test_task_refuses_to_start_from_a_pickle_its_group_can_write(tmp_path, monkeypatch):
    folder = tmp_path / "submitit"
    folder.mkdir(mode=0o775)
    folder.chmod(0o2775)
    (folder / "5_submitted.pkl").write_bytes(b"would run as the job's user")
    for k, v in SLURM_TASK.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("HPCTRAIN_SUBMITIT_VERSION", raising=False)
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR2)}
    try:
        with pytest.raises(
            SystemExit,
            match=r"hpctrain: refusing to load 5_submitted.pkl: .* writable by its "
            r"group or others \(mode 2775\).*chmod 700",
        ):
            task.main([str(folder)])
    finally:  # task.main installs the stop handlers: give pytest its own back
        for s, h in saved.items():
            signal.signal(s, h)
        stop.STOP.installed = False


def test_a_run_directory_the_user_cannot_create_is_one_line(tmp_path):
    """A run.dir under a directory the user cannot write (another user's, a group tree without the
    group's write bit) is refused in one line naming the place and the fix, not a PermissionError
    traceback (measured on the test cluster as an ordinary user). Run as nobody (uid 65534)."""
    top = tmp_path / "theirs"
    top.mkdir(mode=0o755)  # root's: nobody may not write here
    tmp_path.chmod(0o755)
    code = (
        "import sys; from pathlib import Path; from hpctrain.launch.private import private_dir\n"
        "from hpctrain.errors import LaunchError\n"
        "try:\n    private_dir(Path(sys.argv[1]))\nexcept LaunchError as e:\n    print(e)\n"
    )
    folder = top / "runs" / "a" / "submitit"
    r = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code, str(folder)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(hpctrain.__file__).parent.parent)},
    )
    said = r.stdout.splitlines()
    assert len(said) == 1 and said[0].startswith(f"cannot create {folder}: permission denied on /"), r.stdout + r.stderr
    assert said[0].endswith(": choose a run.dir (or run.name) under a directory you can write"), said
    assert "Traceback" not in r.stderr, r.stderr

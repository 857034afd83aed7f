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

from hpctrain.launch import shellfile
from hpctrain.run.source import take_snapshot

SRC = Path(__file__).resolve().parents[2] / "src" / "hpctrain"
ENV = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7"}


def run_part(part: str, cwd: Path, env: dict[str, str], umask: int = 0o022) -> subprocess.CompletedProcess:
    script = "\n".join([f"umask {umask:03o}", "set -eo pipefail", *shellfile.lines(part), "echo passed"])
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

"""The code snapshot a job runs (hpctrain.run.source): named by its content, written whole or not at
all, read-only, taken again only when the code changed — and then said so."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from hpctrain.run import source
from hpctrain.run.source import Snapshot, source_files, source_hash, take_snapshot

SRC = Path(__file__).resolve().parents[2] / "src" / "hpctrain"


@pytest.fixture()
def checkout(tmp_path) -> Path:
    """A copy of this package, standing in for the user's checkout (the worktree is never edited)."""
    pkg = tmp_path / "checkout" / "src" / "hpctrain"
    shutil.copytree(SRC, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return pkg


def tree(pkg: Path) -> dict[str, bytes]:
    return {p.relative_to(pkg).as_posix(): p.read_bytes() for p in source_files(pkg)}


def test_snapshot_is_named_by_its_content_and_read_only(checkout, tmp_path):
    (checkout / "notes.txt").write_text("not code")
    (checkout / "train" / "__pycache__").mkdir()
    (checkout / "train" / "__pycache__" / "loop.cpython-311.pyc").write_bytes(b"\0")
    run = tmp_path / "run"
    snap = take_snapshot(run, checkout)
    assert snap == Snapshot(run / "code" / source_hash(checkout) / "hpctrain", source_hash(checkout), None)
    assert tree(snap.path) == tree(checkout) and "configs/digits_vit.yaml" in tree(snap.path)
    assert not (snap.path / "notes.txt").exists() and not list(snap.path.rglob("__pycache__"))
    files = [p for p in snap.path.rglob("*") if p.is_file()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o444 for p in files)
    info = json.loads((snap.path / source.MANIFEST).read_text())
    assert info["hash"] == snap.hash and info["from"] == str(checkout)
    assert (run / "code" / "latest").read_text().strip() == snap.hash
    assert sorted(p.name for p in (run / "code").iterdir()) == sorted([snap.hash, "latest"])


def test_same_code_again_reuses_the_snapshot(checkout, tmp_path):
    run = tmp_path / "run"
    first = take_snapshot(run, checkout)
    mtime = (first.path / "train" / "loop.py").stat().st_mtime_ns
    again = take_snapshot(run, checkout)
    assert again == first and again.previous is None and again.lines() == [f"code: {first.path} (source {first.hash})"]
    assert (first.path / "train" / "loop.py").stat().st_mtime_ns == mtime  # not rewritten
    assert sorted(p.name for p in (run / "code").iterdir()) == sorted([first.hash, "latest"])  # no temp left


def test_resubmission_after_an_edit_takes_a_new_snapshot_and_says_so(checkout, tmp_path):
    run = tmp_path / "run"
    old = take_snapshot(run, checkout)
    before = tree(old.path)
    with open(checkout / "train" / "loop.py", "a") as f:
        f.write("\n# edited after the first submission\n")
    (checkout / "added.py").write_text("X = 1\n")
    new = take_snapshot(run, checkout)
    assert new.hash == source_hash(checkout) != old.hash and new.previous == old.hash
    assert (new.path / "added.py").is_file() and "edited" in (new.path / "train" / "loop.py").read_text()
    assert tree(old.path) == before and source_hash(old.path) == old.hash  # the queued job's copy is kept
    assert new.lines()[1] == (
        f"hpctrain: the code changed since this directory's last submission: source "
        f"{old.hash} → {new.hash}; this job runs the new snapshot"
    )


def _take(args: tuple[str, str]) -> tuple[str, str]:
    s = take_snapshot(Path(args[0]), Path(args[1]))
    return str(s.path), s.hash


def test_concurrent_submissions_of_the_same_code_make_one_whole_snapshot(checkout, tmp_path):
    """Four processes race to rename their copies into place: one wins, the others drop theirs."""
    run = tmp_path / "run"
    with ProcessPoolExecutor(4) as pool:
        got = set(pool.map(_take, [(str(run), str(checkout))] * 4))
    ((path, digest),) = got
    assert source_hash(Path(path)) == digest == source_hash(checkout)
    assert sorted(p.name for p in (run / "code").iterdir()) == sorted([digest, "latest"])


def test_a_half_written_copy_is_never_taken_for_the_snapshot(checkout, tmp_path):
    """A submission killed while copying leaves only its temporary directory: the final name
    appears by one rename, so the next submission writes the whole snapshot."""
    run = tmp_path / "run"
    half = run / "code" / ".tmp-killed" / "hpctrain"
    half.mkdir(parents=True)
    (half / "__init__.py").write_text("")
    snap = take_snapshot(run, checkout)
    assert tree(snap.path) == tree(checkout)


def test_a_changed_snapshot_is_refused(checkout, tmp_path):
    run = tmp_path / "run"
    snap = take_snapshot(run, checkout)
    p = snap.path / "train" / "loop.py"
    p.chmod(0o644)
    p.write_text(p.read_text() + "\n# edited in the run directory\n")
    with pytest.raises(source.LaunchError, match=f"does not hash to {snap.hash}: it was changed"):
        take_snapshot(run, checkout)


def test_task_records_the_snapshot_it_runs(checkout, tmp_path):
    """What env.json's `source` says from a snapshot: its path, hash, origin, and the hashes compared."""
    snap = take_snapshot(tmp_path / "run", checkout)
    code = "import json, os; from hpctrain.run import source; print(json.dumps(source.check(os.environ)))"
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(snap.path.parent),
        "HPCTRAIN_SOURCE": str(snap.path),
        "HPCTRAIN_SOURCE_HASH": snap.hash,
    }
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["running"] == rec["submitted"] == snap.hash and rec["path"] == str(snap.path)
    assert rec["snapshot"]["path"] == str(snap.path) and rec["snapshot"]["hash"] == snap.hash
    assert rec["snapshot"]["from"] == str(checkout)


def test_snapshot_records_the_checkouts_commit(checkout, tmp_path):
    """From a git checkout (`<root>/src/hpctrain`): its HEAD, which env.json reports as git_commit
    (the run directory may lie in the checkout, whose HEAD has moved on since)."""
    root = checkout.parent.parent
    git = lambda *a: subprocess.run(["git", "-C", str(root), *a], check=True, capture_output=True, text=True)
    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x")
    head = git("rev-parse", "HEAD").stdout.strip()
    (root / "pyproject.toml").write_text("")
    snap = take_snapshot(root / "runs" / "r", checkout)
    assert json.loads((snap.path / source.MANIFEST).read_text())["git_commit"] == head
    assert source.commit_of(snap.path) is None  # inside the checkout's work tree, but not its src/hpctrain


def writable_by_group_or_others(top: Path) -> list[str]:
    return [f"{p} {stat.S_IMODE(p.lstat().st_mode):04o}" for p in [top, *top.rglob("*")] if p.lstat().st_mode & 0o022]


def test_snapshot_is_owner_only_writable_under_umask_002_in_a_setgid_dir(checkout, tmp_path):
    """A group member who could replace `train/entry.py` runs code as the job's owner at the next
    requeue, before the hash check: `code/` is 0755 and every directory of the snapshot 0555 (no
    one, the job's own Python included, writes a __pycache__ there)."""
    project = tmp_path / "project"
    project.mkdir()
    project.chmod(0o2775)  # a group's shared directory
    old = os.umask(0o002)
    try:
        snap = take_snapshot(project / "run", checkout)
    finally:
        os.umask(old)
    assert writable_by_group_or_others(project / "run" / "code") == []
    assert stat.S_IMODE((project / "run" / "code").stat().st_mode) & 0o777 == 0o755
    dirs = [snap.path.parent, *(p for p in snap.path.rglob("*") if p.is_dir())]
    assert {stat.S_IMODE(p.stat().st_mode) for p in dirs} == {0o555}


def test_a_snapshot_another_user_can_change_is_refused(checkout, tmp_path):
    """An old snapshot of ours left group-writable is made owner-only again; one with a directory of
    another user's is refused (the test runs as root: "another user" is a chown)."""
    run = tmp_path / "run"
    snap = take_snapshot(run, checkout)
    (snap.path / "train").chmod(0o775)
    (run / "code").chmod(0o2775)
    take_snapshot(run, checkout)
    assert writable_by_group_or_others(run / "code") == []
    os.chown(snap.path / "train", 4242, -1)
    with pytest.raises(source.LaunchError, match=r"train belongs to uid 4242, not to this job's user.*remove "):
        take_snapshot(run, checkout)


NOBODY = 65534


@pytest.mark.skipif(os.geteuid() != 0, reason="runs commands as another user (setpriv), which needs root")
def test_an_ordinary_user_writes_nothing_into_the_snapshot_and_can_remove_the_run(checkout):
    """The snapshot's directories are 0555: its owner's Python writes no __pycache__ there even without
    PYTHONDONTWRITEBYTECODE, and `rm -r` of the run fails until `chmod -R u+w` (docs/launch.md) or
    `make_removable`. Run as uid 65534 (root ignores modes), in a directory it can reach."""
    base = Path(tempfile.mkdtemp(prefix="hpctrain-snap-", dir="/tmp"))
    try:
        base.chmod(0o755)
        run = base / "run"
        snap = take_snapshot(run, checkout)
        for p in [base, *base.rglob("*")]:  # the user's own directory, run and snapshot
            os.lchown(p, NOBODY, NOBODY)
        as_user = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(snap.path.parent)}
        imp = subprocess.run(
            [*as_user, sys.executable, "-c", "import hpctrain.run.source"], env=env, capture_output=True, text=True
        )
        assert imp.returncode == 0, imp.stderr
        assert not list(snap.path.rglob("__pycache__")) and source_hash(snap.path) == snap.hash
        rm = subprocess.run([*as_user, "rm", "-r", str(run)], env=env, capture_output=True, text=True)
        assert rm.returncode != 0 and "Permission denied" in rm.stderr and snap.path.is_dir()
        fix = subprocess.run(
            [*as_user, "sh", "-c", 'chmod -R u+w "$1" && rm -r "$1"', "sh", str(run)], capture_output=True, text=True
        )
        assert fix.returncode == 0 and not run.exists(), fix.stderr
    finally:
        source.make_removable(base)
        shutil.rmtree(base)


def test_make_removable_opens_only_the_directories(checkout, tmp_path):
    snap = take_snapshot(tmp_path / "run", checkout)
    source.make_removable(tmp_path / "run")
    dirs = [p for p in (tmp_path / "run").rglob("*") if p.is_dir()]
    assert all(p.stat().st_mode & stat.S_IWUSR for p in dirs)
    assert stat.S_IMODE((snap.path / "train" / "loop.py").stat().st_mode) == 0o444
    take_snapshot(tmp_path / "run", checkout)  # the next submission seals it again
    assert {stat.S_IMODE(p.stat().st_mode) for p in snap.path.rglob("*") if p.is_dir()} == {0o555}

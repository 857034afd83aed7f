"""`data.stage_to`: one copy per node, checked by size and the shard index, refused without space."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.data.prep.pack import pack
from hpctrain.data.stage import stage, staged_root
from tests.launch.test_stage_users import OTHER_UID, plant_unsafe


@pytest.fixture(scope="module")
def shards(ident_root, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    pack(ident_root, out, 10, log=lambda *_: None)
    return out


def same(a: Path, b: Path) -> bool:
    return all((b / p.name).read_bytes() == p.read_bytes() for p in a.iterdir() if p.is_file())


def test_staging_twice_copies_once_and_a_cut_copy_is_copied_again(shards, tmp_path):
    logs: list[str] = []
    staged = stage(shards, str(tmp_path / "local"), log=logs.append)
    assert staged.parent == tmp_path / "local" / f"hpctrain-{os.getuid()}" / "data" and same(shards, staged)
    assert all(d.stat().st_mode & 0o777 == 0o700 for d in (staged.parent, staged.parent.parent))
    assert any("copying 16 of 16 files" in s for s in logs)
    assert "staged 16 files" in logs[-1] and logs[-1].endswith("MB/s")
    logs.clear()
    assert stage(shards, str(tmp_path / "local"), log=logs.append) == staged
    assert len(logs) == 1 and logs[0].startswith(f"staging skipped: {staged} holds a complete copy")
    # not by modification time: an old mtime on a whole file is fine, a cut file with the
    # source's mtime is not
    os.utime(staged / "train-00000.idx", (0, 0))
    cut = staged / "val-00001.tar"
    cut.write_bytes(cut.read_bytes()[:1000])
    (staged / "train-00099.tar").write_bytes(b"x" * 100)  # a shard the index no longer lists
    st = (shards / "val-00001.tar").stat()
    os.utime(cut, ns=(st.st_atime_ns, st.st_mtime_ns))
    logs.clear()
    stage(shards, str(tmp_path / "local"), log=logs.append)
    assert any("copying 1 of 16 files" in s for s in logs), logs
    assert same(shards, staged) and not list(staged.glob(".*.part"))
    assert not (staged / "train-00099.tar").exists()


def test_ranks_of_one_node_copy_once_while_the_others_wait(shards, tmp_path):
    """Three ranks arrive while the lock is taken (they show as blocked in /proc/locks); once it is
    free one copies, the other two wait for it and then trust its check of the source."""
    lock = Path(f"{staged_root(shards.resolve(), tmp_path)}.lock")
    lock.parent.mkdir(mode=0o700, parents=True)
    code = f"from hpctrain.data.stage import stage; print('ROOT', stage({str(shards)!r}, {str(tmp_path)!r}))"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(3)]
        inode = f":{os.stat(lock).st_ino} "
        end = time.monotonic() + 60
        while sum("->" in ln and inode in ln for ln in Path("/proc/locks").read_text().splitlines()) < 3:
            assert time.monotonic() < end and all(p.poll() is None for p in procs)
            time.sleep(0.05)
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert sum("copying 16 of 16 files" in o for o in outs) == 1
    assert sum("staging skipped" in o and "checked by the rank that held the lock" in o for o in outs) == 2
    roots = {o.split("ROOT", 1)[1].strip() for o in outs}
    assert len(roots) == 1 and same(shards, Path(roots.pop()))


def test_too_little_free_space_is_refused_before_copying(shards, tmp_path):
    """A 64 kB tmpfs (mounted in a private mount namespace) for shards of about 0.3 MB."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("mounting a small tmpfs needs root and unshare")
    dest = tmp_path / "small"
    dest.mkdir()
    code = (
        "import sys\nfrom hpctrain.data.stage import stage\nfrom hpctrain.errors import UserError\n"
        f"try:\n    stage({str(shards)!r}, {str(dest)!r})\n"
        "except UserError as e:\n    print(e, file=sys.stderr)\n    sys.exit(2)\n"
        f"import os; print(sorted(os.listdir({str(dest)!r})))\n"
    )
    sh = f'mount -t tmpfs -o size=64k tmpfs {dest} && exec {sys.executable} -c "$0"'
    r = subprocess.run(["unshare", "--mount", "sh", "-c", sh, code], capture_output=True, text=True, timeout=60)
    if r.returncode != 2 and "mount" in r.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    need = sum(p.stat().st_size for p in shards.iterdir() if p.is_file())  # not OUT/.pack, the plan
    assert r.returncode == 2, r.stdout + r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and line.startswith("data.stage_to: ") and str(dest) in line
    assert f"needs {need:,} bytes" in line and "has 65,536 bytes" in line
    assert "point data.stage_to at a larger node-local disk" in line


@pytest.mark.parametrize("case", ["other user's", "group-writable", "a symlink"])
def test_an_unsafe_user_directory_skips_staging_and_the_ranks_read_the_shared_shards(shards, tmp_path, case):
    """<stage_to>/hpctrain-<uid> made first by another uid (anyone can, in /tmp), writable by the group,
    or a symlink: staging on that node is skipped with one line naming the reason and the fix, the
    shared shards are read, and nothing is written there (before: the second user's job died on a
    PermissionError, or trained on what another user had put there)."""
    local = tmp_path / "local"
    udir = local / f"hpctrain-{os.getuid()}"
    local.mkdir()
    plant_unsafe(udir, case, tmp_path / "elsewhere")
    logs: list[str] = []
    warned: list[str] = []
    assert stage(shards, str(local), log=logs.append, warn=warned.append) == shards.resolve()
    why = {
        "other user's": f"{udir} belongs to uid {OTHER_UID}, not to this job's uid {os.getuid()}",
        "group-writable": f"{udir} is group- or other-writable (mode 770)",
        "a symlink": f"{udir} is not a directory",
    }[case]
    assert not logs and len(warned) == 1 and "\n" not in warned[0], warned
    assert warned[0] == (
        f"data.stage_to: staging skipped on {os.uname().nodename}: {why}: the staged shards must be in a "
        f"directory only you can write, so this node reads {shards.resolve()}; to stage there, have {udir} "
        "removed (its owner or root), or point data.stage_to at a directory of your own"
    )
    assert sorted(tmp_path.rglob("*")) == sorted(
        [local, udir, *([tmp_path / "elsewhere"] if case == "a symlink" else [])]
    )


def staging_process(shards: Path, local: Path, **kw) -> subprocess.Popen:
    """A process (a rank of a job) that stages and then reads the copy until its stdin closes."""
    code = (
        f"import sys\nfrom hpctrain.data.stage import stage\nprint('ROOT', stage({str(shards)!r}, {str(local)!r}, "
        f"**{kw!r}), flush=True)\nsys.stdin.read()\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def staged_by(p: subprocess.Popen) -> Path:
    """The copy a staging process reads (its ROOT line, after staging's own lines)."""
    for line in p.stdout:
        if line.startswith("ROOT "):
            return Path(line[5:].strip())
    raise AssertionError(p.communicate())


def test_old_copies_go_after_keep_days_unless_a_running_job_reads_them(shards, tmp_path, ident_root):
    """A copy whose last staging is data.stage_keep_days old goes at the user's next staging on the
    node (one line); one that a running process still reads (its shared lock on `.use`) stays."""
    other = tmp_path / "other"
    pack(ident_root, other, 20, log=lambda *_: None)
    local = tmp_path / "local"
    reader = staging_process(other, local)
    old = staged_by(reader)
    assert old == staged_root(other.resolve(), local) and same(other, old)
    eight_days = time.time() - 8 * 86400
    os.utime(f"{old}.use", (eight_days, eight_days))
    logs: list[str] = []
    staged = stage(shards, str(local), log=logs.append, keep_days=7)
    assert old.is_dir() and not any("removed" in s for s in logs), logs  # the reader still holds it
    reader.communicate("")
    os.utime(f"{old}.use", (eight_days, eight_days))
    logs.clear()
    assert stage(shards, str(local), log=logs.append, keep_days=7) == staged
    assert f"removed the staged shards {old}: not staged for 8 day(s) (data.stage_keep_days=7)" in logs, logs
    assert not old.exists() and not Path(f"{old}.use").exists() and not Path(f"{old}.lock").exists()
    assert same(shards, staged)  # the copy being staged stays, whatever its age


def test_remove_at_end_removes_the_copy_when_the_last_process_reading_it_on_the_node_exits(shards, tmp_path):
    """data.stage_remove_at_end: two ranks (or two jobs of the user) read one copy; the first to exit
    leaves it to the other, the last removes it and says so."""
    local = tmp_path / "local"
    ranks = [staging_process(shards, local, remove_at_end=True) for _ in range(2)]
    roots = {staged_by(p) for p in ranks}
    assert roots == {staged_root(shards.resolve(), local)}
    copy = roots.pop()
    first = ranks[0].communicate("")
    assert ranks[0].returncode == 0 and same(shards, copy) and "removed" not in first[0], first
    last = ranks[1].communicate("")
    assert ranks[1].returncode == 0, last
    assert f"removed the staged shards {copy} as the job ended (data.stage_remove_at_end)" in last[0], last
    assert sorted(p.name for p in copy.parent.iterdir()) == [".lock"]

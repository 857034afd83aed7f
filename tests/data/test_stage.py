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
    assert staged.parent == tmp_path / "local" and same(shards, staged)
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
    lock = tmp_path / f".{staged_root(shards.resolve(), tmp_path).name}.lock"
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

"""data.stage_to on a node that two users share (docs/data.md, "Node-local staging"): each user's copy
lives in `<stage_to>/hpctrain-<uid>/data/` (0700); two users staging one dataset on one node both copy
and complete; a directory another user made at a user's name is not used (that node reads the shared
shards, one line says why), so a copy another user pre-seeded is never trained on.

On a Slurm test cluster of its own (tests/launch/test_stage_users.py's `users_cluster`: files every user
can reach, two Unix users made with useradd), each user's job runs the staging code as one srun task on
n1, with the system Python (`/usr/bin/python3`: /root, where this machine's Python lives, is 0700) and a
copy of this checkout's `hpctrain` package on PYTHONPATH: data/stage.py needs the standard library only.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import hpctrain
from hpctrain.data.prep.pack import pack
from hpctrain.data.stage import staged_root
from tests.launch.test_stage_users import users_cluster  # noqa: F401  (a fixture)

CODE = """import hashlib, os, sys
from pathlib import Path
from hpctrain.data.stage import stage
root = stage(sys.argv[1], sys.argv[2])
print("ROOT", root)
print("SUM", hashlib.sha256((root / "train-00000.tar").read_bytes()).hexdigest())
"""

# one srun task on n1: the stand-in for n1's /tmp is <local>/$SLURMD_NODENAME, expanded on the node
JOB = """#!/bin/bash
srun --nodes=1 --ntasks=1 "$HPCT_PYTHON" -c "$HPCT_CODE" "$HPCT_SHARDS" "$HPCT_LOCAL/\\$SLURMD_NODENAME"
"""


def system_python() -> str:
    """A Python 3.10+ that any user may run (this machine's own lives under the 0700 /root)."""
    for p in ("/usr/bin/python3", "/usr/local/bin/python3"):
        ok = os.access(p, os.X_OK) and subprocess.run(
            [p, "-c", "import sys; sys.exit(sys.version_info < (3, 10))"], capture_output=True
        )
        if ok and ok.returncode == 0 and not Path(p).resolve().is_relative_to("/root"):
            return p
    pytest.skip("no Python 3.10+ outside /root for another user to run the staging code")


@pytest.mark.slurm
def test_two_users_stage_one_dataset_on_one_node_and_a_foreign_copy_is_never_used(
    users_cluster,  # noqa: F811  (the fixture imported above)
    ident_root,
):
    """Users A and B submit a job each at once, both staging one dataset (root's shards, 0644) on n1
    under a sticky, world-writable directory as /tmp is: both COMPLETE, each reads a copy of its own
    (before: one name and one lock file for everyone, opened "w": the second user's job died with a
    PermissionError). Then B's directory is gone from n1 (a rebooted node) and A makes it first, with a
    complete-looking copy (meta.json, sizes, `.staged.json`) whose first shard A changed: B's job
    COMPLETES on the shared shards, one line says why, and B never reads A's shard."""
    cluster, base, [(a, uid_a, gid), (b, uid_b, _)] = users_cluster
    python = system_python()
    src = base / "src"
    shutil.copytree(Path(hpctrain.__file__).parent, src / "hpctrain", ignore=shutil.ignore_patterns("__pycache__"))
    shards = base / "shards"
    pack(ident_root, shards, 10, log=lambda *_: None)
    local = base / "local"
    (local / "n1").mkdir(parents=True)
    (local / "n1").chmod(0o1777)  # as /tmp
    for p in (base, src, *src.rglob("*"), shards, *shards.rglob("*"), local):
        p.chmod(0o755 if p.is_dir() else 0o644)
    (local / "n1").chmod(0o1777)
    shared_sum = hashlib.sha256((shards / "train-00000.tar").read_bytes()).hexdigest()
    env = {
        "HPCT_PYTHON": python,
        "HPCT_CODE": CODE,
        "HPCT_SHARDS": str(shards),
        "HPCT_LOCAL": str(local),
        "PYTHONPATH": str(src),
    }

    def as_user(uid: int, *cmd: str, **kw) -> subprocess.CompletedProcess:
        return cluster.run("setpriv", f"--reuid={uid}", f"--regid={gid}", "--init-groups", "--", *cmd, **kw)

    def submit(uid: int, name: str) -> tuple[str, Path]:
        run = base / name
        run.mkdir()
        os.chown(run, uid, gid)
        (run / "job.sh").write_text(JOB)
        r = as_user(
            uid,
            "sbatch",
            "--parsable",
            f"--partition={cluster.partition}",
            "--nodelist=n1",
            f"--output={run}/job.out",
            str(run / "job.sh"),
            env={**env, "HOME": str(run)},
            cwd=run,
        )
        return r.stdout.strip(), run / "job.out"

    def read(out: Path) -> tuple[Path, str, str]:
        """(the shards' root the job read, the checksum of its first shard, the job's output)"""
        text = out.read_text()
        fields = dict(ln.split(" ", 1) for ln in text.splitlines() if ln.startswith(("ROOT ", "SUM ")))
        assert fields.keys() == {"ROOT", "SUM"}, text
        return Path(fields["ROOT"]), fields["SUM"], text

    jobs = [submit(uid_a, "a1"), submit(uid_b, "b1")]
    states = [cluster.wait_done(j, 120) for j, _ in jobs]
    assert states == ["COMPLETED", "COMPLETED"], [o.read_text() for _, o in jobs]
    copies = {}
    for (_, out), uid in zip(jobs, (uid_a, uid_b)):
        root, digest, text = read(out)
        udir = local / "n1" / f"hpctrain-{uid}"
        assert root.parent == udir / "data" and digest == shared_sum, text
        assert all(d.stat().st_uid == uid and d.stat().st_mode & 0o777 == 0o700 for d in (udir, root.parent))
        copies[uid] = root
    assert copies[uid_a].name == copies[uid_b].name  # one dataset, a copy per user
    r = as_user(uid_a, "ls", str(copies[uid_b].parent), check=False)
    assert r.returncode != 0 and "Permission denied" in r.stderr, r.stderr

    # B's directory is gone from n1; A makes it first, with a complete-looking copy of a changed shard
    b_dir = local / "n1" / f"hpctrain-{uid_b}"
    shutil.rmtree(b_dir)
    planted = staged_root(shards.resolve(), local / "n1").relative_to(local / "n1" / f"hpctrain-{os.getuid()}")
    assert copies[uid_b] == b_dir / planted
    plant = f"""umask 022; mkdir -p -m 755 {b_dir / planted.parent} && cp -a {copies[uid_a]} {b_dir / planted} &&
printf EVIL | dd of={b_dir / planted}/train-00000.tar bs=1 seek=600 conv=notrunc status=none"""
    r = as_user(uid_a, "bash", "-c", plant, check=False)
    assert r.returncode == 0, r.stderr
    assert (b_dir / planted / "train-00000.tar").stat().st_size == (shards / "train-00000.tar").stat().st_size
    job, out = submit(uid_b, "b2")
    assert cluster.wait_done(job, 120) == "COMPLETED", out.read_text()
    root, digest, text = read(out)
    assert root == shards.resolve() and digest == shared_sum, text
    why = f"{b_dir} belongs to uid {uid_a}, not to this job's uid {uid_b}"
    assert text.count(why) == 1 and f"data.stage_to: staging skipped on n1: {why}: " in text, text
    # the same with A's directory closed to B (0700: B cannot even open it)
    as_user(uid_a, "chmod", "700", str(b_dir))
    job, out = submit(uid_b, "b3")
    assert cluster.wait_done(job, 120) == "COMPLETED", out.read_text()
    root, digest, text = read(out)
    assert root == shards.resolve() and digest == shared_sum and text.count(why) == 1, text

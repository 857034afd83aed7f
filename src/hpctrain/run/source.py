"""Which hpctrain a task runs: the code that submitted the job, frozen at submission.

The recipes install hpctrain into the image, and submitit pickles `train_task` by reference, so
without care every task imports the image's copy: a new config key fails on every rank, a fix
is silently absent, and both report the same version. Nor may a task import the live checkout:
users edit or `git pull` it while a job waits in the queue or between requeues. So submission
copies the package into the job's directory (`snapshot`: `<root>/code/<hash>/hpctrain`, read-only,
its directories too, named by its source hash, holding nothing its hash does not cover); the batch
script binds that copy into the container (`container.source_mount`) ahead of the image's copy, or
puts it first on PYTHONPATH without a container, in every attempt, and never writes into it; every
rank hashes the package it imported and refuses to train when it differs from the submitted hash.
No torch here: the login node hashes too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpctrain.errors import LaunchError
from hpctrain.run.layout import CODE
from hpctrain.run.owner import GROUP_OTHER_WRITE, drop_others_write, others_can_write, world_can_rename

SUFFIXES = (".py", ".yaml", ".yml")
LATEST = "latest"  # <root>/code/latest: the hash of the last submission's snapshot
MANIFEST = "_snapshot.json"  # inside a snapshot's package: where it came from (not hashed, not code)


def package_dir() -> Path:
    """The directory of the `hpctrain` package this process imported (this module is in its `run/`)."""
    return Path(__file__).resolve().parent.parent


def source_files(pkg: Path) -> list[Path]:
    """The files that make the package's code: Python and YAML, no bytecode caches; sorted."""
    return sorted(q for q in pkg.rglob("*") if is_source(q.relative_to(pkg)) and q.is_file())


def is_source(rel: Path) -> bool:
    """A file a snapshot holds (`rel` relative to the package): Python and YAML, no bytecode cache."""
    return rel.suffix in SUFFIXES and "__pycache__" not in rel.parts


def foreign_file(pkg: Path) -> Path | None:
    """A file or directory in the snapshot `pkg` that its hash does not cover and Python could import
    (a .pyc, which a __pycache__/ entry can make Python prefer to the .py; an extension module, which
    it prefers to both), or anything else a copy never holds; None: only the hashed files and the record."""
    for p in sorted(pkg.rglob("*")):
        rel = p.relative_to(pkg)
        if p.name == "__pycache__" or p.is_symlink():
            return p
        if not p.is_dir() and not (p.is_file() and (is_source(rel) or p.name == MANIFEST)):
            return p
    return None


def source_hash(pkg: Path | None = None) -> str:
    """sha256 over the package's Python and YAML files (relative path + bytes), first 16 hex digits.
    Bytecode caches and other files do not count, so the same sources hash alike everywhere."""
    pkg = pkg or package_dir()
    h = hashlib.sha256()
    for p in source_files(pkg):
        h.update(p.relative_to(pkg).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Snapshot:
    """A copy of the submitting package under a job's directory."""

    path: Path  # <root>/code/<hash>/hpctrain: the package the tasks import
    hash: str  # its source hash (the directory's name)
    previous: str | None = None  # the hash of this root's last snapshot when it differs (the code changed)

    def lines(self) -> list[str]:
        """What `submit` prints about it: where, and a change since the root's last submission."""
        out = [f"code: {self.path} (source {self.hash})"]
        if self.previous:
            out.append(
                f"hpctrain: the code changed since this directory's last submission: source {self.previous} "
                f"→ {self.hash}; this job runs the new snapshot"
            )
        return out


def snapshot_path(root: Path, digest: str) -> Path:
    return root / CODE / digest / "hpctrain"


def checkout_root(pkg: Path | None = None) -> Path | None:
    """The checkout that holds this package (`<root>/src/hpctrain` with `<root>/pyproject.toml`),
    or None for an installed copy (a wheel in site-packages, a snapshot)."""
    pkg = pkg or package_dir()
    root = pkg.parent.parent
    if pkg.parent.name == "src" and (root / "pyproject.toml").is_file():
        return root
    return None


def commit_of(pkg: Path) -> str | None:
    """The git commit of the checkout whose `src/hpctrain` is `pkg`; None for an installed copy."""
    root = checkout_root(pkg)
    return git_commit(root) if root else None


def git_commit(root: Path) -> str | None:
    """`<commit>` or `<commit>+modified` (tracked files changed) of the checkout at `root`; None when
    git is missing, `root` is not the top of a git work tree, or git fails."""

    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if not top or Path(top).resolve() != root.resolve():  # an installed copy inside someone else's repository
        return None
    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    changed = git("status", "--porcelain", "--untracked-files=no")
    return f"{commit}+modified" if changed else commit


def take_snapshot(root: Path, pkg: Path | None = None) -> Snapshot:
    """Copy `pkg` (this process's package) to `<root>/code/<hash>/hpctrain`, once per content.

    The copy is made first and hashed afterwards, so its name is the hash of what it holds even
    when the checkout changes during the copy. It is written under a temporary name and renamed
    into place, its files read-only; an identical snapshot already there is kept (idempotent).
    Old snapshots stay: a few hundred kB each, and a queued job may still need one.
    `code/` is writable by this user only (0755, whatever the umask) and every directory of the
    snapshot by no one (0555: no Python writes a __pycache__ into it, `make_removable` undoes it): a
    task imports it before it checks the hash, so a group member who could replace `train/entry.py`
    or plant a .pyc would run code as the job's owner (`check_private` refuses such a snapshot).
    """
    pkg = (pkg or package_dir()).resolve()
    code = root / CODE
    code.mkdir(parents=True, exist_ok=True)
    drop_others_write(code)
    latest = code / LATEST
    before = latest.read_text().strip() if latest.is_file() else None
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=code))
    try:
        for src in source_files(pkg):
            dst = tmp / "hpctrain" / src.relative_to(pkg)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
        digest = source_hash(tmp / "hpctrain")
        manifest = {
            "hash": digest,
            "from": str(pkg),
            "git_commit": commit_of(pkg),
            "taken": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (tmp / "hpctrain" / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        for p in (tmp / "hpctrain").rglob("*"):
            p.chmod(0o444 if p.is_file() else 0o555)  # mkdir kept the umask (0775 under 002)
        seal(tmp)
        final = code / digest
        if not snapshot_path(root, digest).is_dir():
            try:
                tmp.rename(final)  # atomic: the snapshot appears whole or not at all
            except OSError:  # another submission renamed the same content first
                if not snapshot_path(root, digest).is_dir():
                    raise
    finally:
        if tmp.is_dir():  # this copy lost the race, or the copy failed
            make_removable(tmp)
            shutil.rmtree(tmp, ignore_errors=True)
    check_private(root, digest)
    seal(code / digest)  # one an earlier version left writable (0755)
    if source_hash(snapshot_path(root, digest)) != digest:
        raise LaunchError(
            f"the code snapshot {snapshot_path(root, digest)} does not hash to {digest}: it was "
            f"changed after it was written; remove it (chmod -R u+w {code / digest} && rm -r {code / digest}) "
            "and submit again"
        )
    tmp_latest = code / f".{LATEST}.{os.getpid()}"
    tmp_latest.write_text(digest + "\n")
    tmp_latest.chmod(0o644)
    tmp_latest.replace(latest)
    return Snapshot(snapshot_path(root, digest), digest, before if before and before != digest else None)


def seal(top: Path) -> None:
    """Make the directories under `top` (and `top`) read-only, 0555; ours only (others are refused)."""
    for p in [top, *top.rglob("*")]:
        st = p.lstat()
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) != 0o555:
            p.chmod(0o555)


def make_removable(top: Path) -> None:
    """`chmod -R u+w` on the directories of a snapshot (or a run that holds one), ours only: what `rm -r`
    needs, since a snapshot's directories are read-only (0555)."""
    for p in [top, *top.rglob("*")]:
        st = p.lstat()
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & stat.S_IWUSR:
            p.chmod(stat.S_IMODE(st.st_mode) | stat.S_IWUSR)


def snapshot_writers(root: Path, digest: str) -> str | None:
    """Why a user other than this process's could change the snapshot `digest` under `root`
    (`code/`, a directory or a file in it), or why it holds what its hash does not cover
    (`foreign_file`); None: none can. Ours made under umask 002 or by an earlier hpctrain are made
    owner-only first. `root` is resolved: the tasks import the resolved path (shell/source.sh)."""
    root = root.resolve()
    top = root / CODE / digest
    paths = [root / CODE, top, *sorted(top.rglob("*"))]
    for p in paths:
        drop_others_write(p)
    for p in paths:
        st = p.lstat()
        if p.is_symlink():  # the copy holds none: planted
            return f"{p} is a symbolic link"
        if p.is_dir():
            why = others_can_write(p)
            if why:
                return why
        elif st.st_uid != os.getuid() or st.st_mode & GROUP_OTHER_WRITE:
            return f"{p} is writable by another user (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})"
    beside = sorted(p for p in top.iterdir() if p.name != "hpctrain")  # on the tasks' PYTHONPATH too
    planted = beside[0] if beside else foreign_file(top / "hpctrain")
    if planted:
        return f"{planted} is not a source file of the snapshot, which its hash would not cover"
    return None


def renamable_above(root: Path) -> str | None:
    """Why any user could replace the way to `root`'s snapshots: a directory above `code/` that every
    user may write without the sticky bit (run.owner); None: no such directory. A group-writable
    project tree is no such directory (run.owner says why)."""
    for p in (root.resolve() / CODE).parents:
        why = world_can_rename(p)
        if why:
            return why
    return None


def check_private(root: Path, digest: str) -> None:
    """Refuse (LaunchError, one line with the fix) a snapshot another user could change."""
    why = renamable_above(root)
    if why:
        raise LaunchError(
            f"the code snapshot {root / CODE / digest} can be changed by another user ({why}); the job's "
            "tasks run it as you: chmod o-w (or +t) that directory, or choose a run.dir under directories "
            "other users cannot write"
        )
    why = snapshot_writers(root, digest)
    if why:
        top = root / CODE / digest
        raise LaunchError(
            f"the code snapshot {top} can be changed by another user: {why}; the job's tasks run it as you. "
            f"Check who changed it, then remove it (chmod -R u+w {top} && rm -r {top}) and submit again"
        )


def manifest(pkg: Path | None = None) -> dict | None:
    """The snapshot record of the imported package; None when it is not a snapshot."""
    p = (pkg or package_dir()) / MANIFEST
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def check(env: Mapping[str, str]) -> dict:
    """Compare this process's hpctrain with the submitter's (HPCTRAIN_SOURCE_HASH); the record
    for env.json (`snapshot`: the host path given as HPCTRAIN_SOURCE and where the copy came
    from, when the package is a snapshot). Raises LaunchError, before any training, when they differ."""
    running = source_hash()
    submitted = env.get("HPCTRAIN_SOURCE_HASH") or None
    rec: dict = {"running": running, "submitted": submitted, "path": str(package_dir()), "snapshot": None}
    snap = manifest()
    if snap is not None:
        rec["snapshot"] = {**snap, "path": env.get("HPCTRAIN_SOURCE") or str(package_dir())}
    if submitted and submitted != running:
        raise LaunchError(
            f"this task runs hpctrain from {package_dir()} (source {running}), not the code that submitted "
            f"the job (source {submitted}): the image's copy shadows it, or the bound copy changed since "
            "submission; keep container.bind_source on (and the run directory on a file system the nodes "
            "see), then resubmit"
        )
    return rec

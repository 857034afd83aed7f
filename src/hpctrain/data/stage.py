"""`data.stage_to`: copy the shards of `data pack` to node-local storage before training.

Once per node: every rank calls `stage`, one holds the lock (`flock` on a file in the node-local
folder) and copies while the others wait for it, then find the copy complete. A copy is complete
when its `meta.json` (the shard index) equals the source's and every file the index lists has the
source's size: modification times are not compared (a copy's mtime is when it was copied, and
clocks differ between nodes). A file of the wrong size (a copy cut short by a killed job) is copied
again; a node that holds a complete copy already (a requeued job) copies nothing. Free space is
checked before the first byte is written. `meta.json` is copied last, so a copy cut short never
looks complete. Ranks that waited for the lock trust the holder's check of the source (recorded in
`.staged.json` with the index's digest) and compare only local sizes: the shared file system sees
one round of `stat` calls per node, not one per rank.

Node-local disks (/tmp) are every user's: each user's copies live in a directory of their own,
`<data.stage_to>/hpctrain-<uid>/data/` (0700, run/owner.py's `private_dir`, as container.stage_image's
`hpctrain-<uid>`), with their locks. Where that directory is another user's, a symlink or writable by
others (anyone can make the name first), staging is skipped on that node with one line and the ranks
read the shared shards: another user can neither fail the job nor hand it a copy. Each rank holds a
shared `flock` on the copy's `.use` file while it lives; a copy whose `.use` no rank holds and that no
staging touched for data.stage_keep_days is removed at the user's next staging on the node, and with
data.stage_remove_at_end the last rank on the node to exit removes it. Torch-free, standard library
only (it runs on any Python 3.10+).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from hpctrain.data.folder import DataError
from hpctrain.data.meter import MB, Meter, fmt_bytes
from hpctrain.data.wds import META, shard_files
from hpctrain.run.owner import private_dir

RECORD = ".staged.json"
CHUNK = 16 << 20  # bytes per read/write while copying (progress granularity)


DAY = 86400
HELD: list[int] = []  # the `.use` locks this process holds (shared) on the copies it reads


def staged_root(root: Path, base: Path) -> Path:
    """Where this user's copy of `root` lives under `base` (one folder per source path)."""
    tag = hashlib.sha1(str(root).encode()).hexdigest()[:10]
    return base / f"hpctrain-{os.getuid()}" / "data" / f"{root.name}-{tag}"


def stage(
    root: str | os.PathLike,
    dest: str,
    log=print,
    every_s: float = 5.0,
    keep_days: int = 7,
    remove_at_end: bool = False,
    warn=None,
) -> Path:
    """Make `dest` (node-local) hold this user's complete copy of the shards at `root`; returns the
    copy's root, or `root` itself where this user's directory there is unsafe (`warn`, once a node)."""
    root = Path(root).resolve()
    base = Path(os.path.expandvars(os.path.expanduser(dest)))
    if "$" in str(base):
        raise DataError(f"data.stage_to={dest!r}: an environment variable in it is not set on this node")
    if not (root / META).is_file():
        raise DataError(f"data.stage_to copies `data pack` shards, but {root / META} is missing")
    meta_bytes = (root / META).read_bytes()
    names = shard_files(json.loads(meta_bytes))
    target = staged_root(root, base)
    try:
        base.mkdir(parents=True, exist_ok=True)
        why = private_dir(target.parent.parent) or private_dir(target.parent)
    except OSError as e:
        raise DataError(
            f"data.stage_to={dest!r}: cannot create {e.filename or base} ({e.strerror}): point data.stage_to "
            "at a writable node-local directory such as $TMPDIR, or clear it to read the shards in place"
        ) from None
    if why:
        first = os.environ.get("SLURM_LOCALID", os.environ.get("LOCAL_RANK", "0")) == "0"
        ((warn or log) if first else log)(
            f"data.stage_to: staging skipped on {os.environ.get('SLURMD_NODENAME') or os.uname().nodename}: "
            f"{why}: the staged shards must be in a directory only you can write, so this node reads {root}; "
            f"to stage there, have {target.parent.parent} removed (its owner or root), or point data.stage_to "
            "at a directory of your own"
        )
        return root
    use = target.with_name(f"{target.name}.use")
    with _locked(target.parent / ".lock"):  # this user's copies: staging and removal, one at a time
        fd = os.open(use, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)  # held while this process lives: no clean-up removes the copy
        HELD.append(fd)
        os.utime(fd)  # its mtime: the copy's last staging (data.stage_keep_days)
        _clean(target.parent, target, keep_days, log)
    if remove_at_end:
        atexit.register(_remove_at_end, target, fd, log)
    target.mkdir(mode=0o700, exist_ok=True)
    lock = target.with_name(f"{target.name}.lock")
    with open(os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            waited = False
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise DataError(
                    f"data.stage_to={dest!r}: {base} refuses file locks ({os.strerror(e.errno)}); "
                    "stage to a node-local disk such as $TMPDIR, not a shared file system"
                ) from None
            fcntl.flock(f, fcntl.LOCK_EX)  # another rank of this node is copying: wait for it
            waited = True
        digest = hashlib.sha256(meta_bytes).hexdigest()
        sizes = _recorded(target, digest) if waited else None
        trusted = sizes is not None
        if sizes is None:
            sizes = {n: (root / n).stat().st_size for n in names}  # the source, as it is now
        stale = [n for n in names if _size(target / n) != sizes[n]]
        total = sum(sizes.values())
        if not stale and _size(target / META) >= 0 and (target / META).read_bytes() == meta_bytes:
            how = "checked by the rank that held the lock" if trusted else "checked against the source"
            log(
                f"staging skipped: {target} holds a complete copy of {root} ({len(names)} files, "
                f"{fmt_bytes(total)}; meta.json and every file's size match, {how})"
            )
            return target
        _copy(root, target, stale, sizes, meta_bytes, digest, log, every_s)
    return target


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive `flock` on `path` (in this user's own directory) while the block runs."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:  # ENOLCK, ENOSYS: Lustre mounted noflock, NFS without lockd
            raise DataError(
                f"data.stage_to: {path.parent} refuses file locks ({e.strerror}); stage to a node-local disk "
                "such as $TMPDIR, not a shared file system"
            ) from None
        yield
    finally:
        os.close(fd)


def _remove(copy: Path) -> None:
    """Remove a copy and its lock files (under the directory's lock, its `.use` held exclusively)."""
    shutil.rmtree(copy, ignore_errors=True)
    for suffix in (".lock", ".use"):
        copy.with_name(copy.name + suffix).unlink(missing_ok=True)


def _clean(data: Path, keep: Path, keep_days: int, log) -> None:
    """Remove this user's other copies that no staging touched for `keep_days` and no process reads."""
    now = time.time()
    for use in data.glob("*.use"):
        copy, age = use.with_suffix(""), now - use.lstat().st_mtime
        if copy == keep or age < keep_days * DAY:
            continue
        fd = os.open(use, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a running job reads it
            os.close(fd)
            continue
        _remove(copy)
        os.close(fd)
        log(
            f"removed the staged shards {copy}: not staged for {int(age // DAY)} day(s) "
            f"(data.stage_keep_days={keep_days})"
        )


def _remove_at_end(copy: Path, fd: int, log) -> None:
    """data.stage_remove_at_end, as this process exits: the copy goes once no other process reads it."""
    try:
        with _locked(copy.parent / ".lock"):
            fcntl.flock(fd, fcntl.LOCK_UN)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # another rank or job on this node still reads it: the last one removes it
                return
            _remove(copy)
    except (OSError, DataError) as e:  # the directory went (a /tmp cleaned): nothing to remove, no traceback
        log(f"data.stage_remove_at_end: {copy} not removed: {e}")
        return
    log(f"removed the staged shards {copy} as the job ended (data.stage_remove_at_end)")


def _copy(
    root: Path,
    target: Path,
    stale: list[str],
    sizes: dict[str, int],
    meta_bytes: bytes,
    digest: str,
    log,
    every_s: float,
) -> None:
    (target / META).unlink(missing_ok=True)  # incomplete from here until the end
    (target / RECORD).unlink(missing_ok=True)
    for n in stale:
        (target / n).unlink(missing_ok=True)  # a short or stale copy is useless: its space counts as free
    listed = set(sizes)
    for p in target.iterdir():  # left by a killed copy, or shards the index no longer lists
        if p.is_file() and (p.name.endswith(".part") or p.suffix in (".tar", ".idx") and p.name not in listed):
            p.unlink()
    need = sum(sizes[n] for n in stale) + len(meta_bytes)
    free = shutil.disk_usage(target).free
    if need > free:
        raise DataError(
            f"data.stage_to: {target} needs {need:,} bytes ({fmt_bytes(need)}) for {len(stale)} shard files "
            f"but its file system has {free:,} bytes ({fmt_bytes(free)}) free: point data.stage_to at a "
            "larger node-local disk, free space there, or clear data.stage_to to read the shards in place"
        )
    have = len(sizes) - len(stale)
    log(
        f"staging {root} to {target}: copying {len(stale)} of {len(sizes)} files ({fmt_bytes(need)}; "
        f"{have} complete already), {fmt_bytes(free)} free there"
    )
    meter = Meter("staging", len(stale), "files", total_bytes=need, log=log, every_s=every_s, tty=False)
    for n in stale:
        tmp = target / f".{n}.part"
        with open(root / n, "rb") as src, open(tmp, "wb") as dst:
            while chunk := src.read(CHUNK):
                dst.write(chunk)
                meter.add(0, len(chunk))
        if tmp.stat().st_size != sizes[n]:
            raise DataError(
                f"{root / n} changed size while it was staged ({sizes[n]:,} → "
                f"{tmp.stat().st_size:,} bytes): is `data pack` still writing to {root}?"
            )
        tmp.replace(target / n)
        meter.add(1)
    (target / RECORD).write_text(json.dumps({"source": str(root), "meta_sha256": digest, "sizes": sizes}))
    tmp = target / f".{META}.part"
    tmp.write_bytes(meta_bytes)
    tmp.replace(target / META)  # last: the copy is complete
    log(
        f"staged {len(stale)} files ({fmt_bytes(meter.nbytes)}) to {target} in {meter.seconds:.1f} s: "
        f"{meter.nbytes / MB / max(meter.seconds, 1e-9):.1f} MB/s"
    )


def _recorded(target: Path, digest: str) -> dict[str, int] | None:
    """The source sizes the last holder of the lock checked, if it checked this same index."""
    try:
        rec = json.loads((target / RECORD).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return rec["sizes"] if rec.get("meta_sha256") == digest else None


def _size(p: Path) -> int:
    """The size of `p`, a regular file of this user (not a symlink); -1 for anything else."""
    try:
        st = p.lstat()
    except FileNotFoundError:
        return -1
    return st.st_size if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() else -1

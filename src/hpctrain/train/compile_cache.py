"""`compile.enabled`: Inductor's and Triton's on-disk caches survive requeues, as ONE archive in the run.

Without it every attempt of every job recompiles (Inductor's default cache is /tmp/torchinductor_<user>
on whichever node the attempt lands). With it the caches of an attempt live on node-local disk
(`data.stage_to` when set, else the node's temp directory, $TMPDIR or /tmp), and between attempts in
one archive, `<compile.cache>/<key>.tar` (default <run>/compile_cache; a sweep shares
<sweep>/compile_cache). The key is the image digest, the torch version and a hash of the model config:
a new image or torch never reads entries another wrote, and members of a sweep with the same model
share theirs. Inductor keys each entry on the graph, shapes and its own config besides, so the key only
keeps unrelated entries apart.

Why an archive (issue 55, docs/profiling.md): Inductor writes thousands of small files, each a create and
a rename; on the shared file system that was every rank's metadata load on the metadata server. Now the
shared file system sees, per attempt, one read of the archive per node at start (the first rank of the
node unpacks it under a file lock, the others find it done) and one atomic write (temp file + rename) by
rank 0 at the end, finished or stopped for a requeue; the next attempt, on whatever node, starts warm.

TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR are read when Inductor first needs them, at the first
compiled call (torch 2.13: runtime/cache_dir_utils.cache_dir reads the variable on every call; older
torch may keep the first answer), so setting them before the model is built is early enough. The FX
graph cache (the compiled graphs, the part that saves most) is on by default in torch 2.13 and off in
2.2 (it read TORCHINDUCTOR_FX_GRAPH_CACHE == "1"): it is turned on here (docs/profiling.md, sources).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import tarfile
import tempfile
from pathlib import Path

import torch

from hpctrain.config import Config, to_dict
from hpctrain.run.layout import atomic_write
from hpctrain.run.owner import private_dir

log = logging.getLogger("hpctrain")

DIGEST_ENV = "HPCTRAIN_IMAGE_DIGEST"  # the image's digest, where the launcher or the image knows it
DONE = ".hpctrain-restored"  # in the node-local cache: which archive (size, mtime) it holds
UNPACK = ".hpctrain-unpack-"  # a node-local temp directory an archive is unpacked into


def cache_key(cfg: Config, image_digest: str, torch_version: str) -> str:
    """`<image digest or noimage>-torch<version>-<model config hash>`, safe as one path component."""
    model = json.dumps(
        {"model": to_dict(cfg.model), "compile_mode": cfg.compile.mode, "amp": cfg.train.amp}, sort_keys=True
    )
    digest = re.sub(r"[^A-Za-z0-9._-]", "_", image_digest.removeprefix("sha256:"))[:24] or "noimage"
    version = re.sub(r"[^A-Za-z0-9.+-]", "_", torch_version)
    return f"{digest}-torch{version}-{hashlib.sha256(model.encode()).hexdigest()[:12]}"


def archive_path(cfg: Config, run_dir: Path, torch_version: str) -> Path:
    """`<compile.cache or <run>/compile_cache>/<key>.tar`: the attempts' one shared copy."""
    base = Path(os.path.expandvars(cfg.compile.cache)).expanduser() if cfg.compile.cache else run_dir / "compile_cache"
    return base / f"{cache_key(cfg, os.environ.get(DIGEST_ENV, ''), torch_version)}.tar"


def add_new(src: Path, dst: Path) -> int:
    """Move or copy the files under `src` that `dst` lacks, each through a temporary name and a rename;
    returns how many. Existing files are left alone (Inductor's entries are content-keyed: same name,
    same use); a reader never sees half a file."""
    n = 0
    for path in src.rglob("*"):
        rel = path.relative_to(src)
        target = dst / rel
        if not path.is_file() or path.is_symlink() or rel.name == DONE or target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        shutil.copy2(path, tmp)
        os.replace(tmp, target)
        n += 1
    return n


def _signature(archive: Path) -> str:
    try:
        st = archive.stat()
    except FileNotFoundError:
        return "none"
    return f"{st.st_size} {st.st_mtime_ns}"


def unpack_new(archive: Path, local: Path) -> int:
    """The archive's files that `local` lacks, unpacked into a node-local temp directory (regular files
    and directories only, no path outside it: tarfile's "data" filter) and renamed in; how many."""
    if not archive.is_file():
        return 0
    tmp = Path(tempfile.mkdtemp(prefix=UNPACK, dir=local))
    try:
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if (m.isfile() or m.isdir()) and not (local / m.name).is_file()]
            tar.extractall(tmp, members=members, filter="data")
        return add_new(tmp, local)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _skip(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """What goes into the archive: Inductor's and Triton's files, not this module's own marker and temp names."""
    name = Path(info.name).name
    if not (info.isfile() or info.isdir()) or name == DONE or name.startswith(UNPACK) or name.endswith(".tmp"):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def node_dir(base: str, name: str) -> Path | None:
    """`<base>/hpctrain-<uid>/compile-<name>` on the node-local disk, in this user's own 0700 directory
    (data/stage.py's rule); None where that directory is unsafe (another user's, writable by others)."""
    root = Path(os.path.expandvars(os.path.expanduser(base)))
    udir = root / f"hpctrain-{os.getuid()}"
    root.mkdir(parents=True, exist_ok=True)
    why = private_dir(udir)
    if why:
        log.warning("compile cache: not in %s: %s; this rank uses a private temp directory of its own", root, why)
        return None
    local = udir / f"compile-{name}"
    local.mkdir(mode=0o700, exist_ok=True)
    return local


def restore(archive: Path, local: Path) -> int:
    """Unpack `archive` into the node-local cache once per node and archive version: a file lock, the first
    rank of the node unpacks, the others wait and find it done (`DONE` names the archive's size and
    mtime). Also takes an older hpctrain's cache directory `<cache>/<key>/` the same way. How many files."""
    legacy = archive.with_suffix("")
    lock = local.parent / f".{local.name}.lock"
    with open(os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        sig = _signature(archive)
        done = local / DONE
        if done.is_file() and done.read_text() == sig:
            return 0
        n = unpack_new(archive, local) + (add_new(legacy, local) if legacy.is_dir() else 0)
        done.write_text(sig)
    log.info("compile cache: %d files from %s unpacked to node-local %s", n, archive, local)
    return n


class CompileCache:
    """This rank's Inductor/Triton cache on node-local disk, and the one archive it is saved to (`save`)."""

    def __init__(self, archive: Path, local: Path):
        self.archive, self.local = archive, local

    @property
    def dir(self) -> Path:
        return self.local

    def save(self, is_main: bool) -> None:
        """Rank 0: the node-local cache (what the attempt started from and added) as ONE archive in the run
        directory, atomically (temp file, rename: a reader sees the old archive or the new one). Entries
        another job sharing the archive (a sweep's member) saved meanwhile are taken in first."""
        if not is_main:
            return
        try:
            unpack_new(self.archive, self.local)
            self.archive.parent.mkdir(parents=True, exist_ok=True)

            def write(f) -> None:
                with tarfile.open(fileobj=f, mode="w") as tar:
                    tar.add(self.local, arcname=".", filter=_skip)

            atomic_write(self.archive, write)
        except (OSError, tarfile.TarError) as e:  # the run's result does not depend on it: say so and go on
            log.warning(
                "compile cache: saving %s to %s failed (%s): the next attempt compiles again",
                self.local,
                self.archive,
                e,
            )
            return
        log.info("compile cache: %s saved to %s (one archive)", self.local, self.archive)

    def report(self) -> None:
        """Inductor's FX graph cache hits and misses in this process (the rank log)."""
        # torch.compile's stack (Dynamo, Inductor: ~1.2 s to import, torch 2.13): compile.enabled only
        from torch._dynamo.utils import counters

        c = counters["inductor"]
        log.info(
            "compile cache %s: FX graph cache %d hits, %d misses",
            self.dir,
            c["fxgraph_cache_hit"],
            c["fxgraph_cache_miss"],
        )


def local_name(archive: Path) -> str:
    """`<key>-<hash of the archive's path>`: one node-local cache per archive, so that another run on the
    node (its own `<run>/compile_cache`) starts from its own archive, not from what this one compiled."""
    return f"{archive.stem}-{hashlib.sha256(str(archive.resolve()).encode()).hexdigest()[:10]}"


def open_cache(archive: Path, node_base: str) -> CompileCache:
    """The node-local cache for `archive` under `node_base` (data.stage_to, or the node's temp directory),
    restored from the archive; a rank whose node directory is unsafe gets a private one of its own."""
    local = node_dir(node_base, local_name(archive))
    if local is None:
        local = Path(tempfile.mkdtemp(prefix=f"hpctrain-compile-{archive.stem}-"))
    try:
        restore(archive, local)
    except (OSError, tarfile.TarError) as e:  # a damaged archive: compile again, say so
        log.warning("compile cache: %s not restored (%s): this attempt compiles again", archive, e)
    return CompileCache(archive, local)


def setup(cfg: Config, run_dir: Path) -> CompileCache | None:
    """Point Inductor and Triton at the node-local cache (compile.enabled only; None otherwise), restored
    from the run's archive before anything is compiled; the FX graph cache on (torch 2.2's default is off)."""
    if not cfg.compile.enabled:
        return None
    # torch.compile's stack (Inductor, Dynamo: ~1.2 s to import, torch 2.13): compile.enabled only
    import torch._inductor.config as inductor_config

    cache = open_cache(archive_path(cfg, run_dir, torch.__version__), cfg.data.stage_to or tempfile.gettempdir())
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache.dir)
    os.environ["TRITON_CACHE_DIR"] = str(cache.dir / "triton")
    inductor_config.fx_graph_cache = True
    log.info("compile cache: %s, saved to %s (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR)", cache.dir, cache.archive)
    return cache

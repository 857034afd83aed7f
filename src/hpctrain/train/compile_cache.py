"""`compile.enabled`: Inductor's and Triton's on-disk caches in a directory that survives requeues.

Without it every attempt of every job recompiles (Inductor's default cache is /tmp/torchinductor_<user>
on whichever node the attempt lands). With it the caches live under `compile.cache` (default
<run>/compile_cache; a sweep shares <sweep>/compile_cache), in a subdirectory keyed by the image
digest, the torch version and a hash of the model config: a new image or torch never reads entries
another wrote, and members of a sweep with the same model share theirs. Inductor keys each entry on
the graph, shapes and its own config besides, so the key only keeps unrelated entries apart.

TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR are read when Inductor first needs them, at the first
compiled call (torch 2.13: runtime/cache_dir_utils.cache_dir reads the variable on every call; older
torch may keep the first answer), so setting them before the model is built is early enough. The FX
graph cache (the compiled graphs, the part that saves most) is on by default in torch 2.13 and off in
2.2 (it read TORCHINDUCTOR_FX_GRAPH_CACHE == "1"): it is turned on here (docs/profiling.md, sources).

With `data.stage_to` (node-local disk) the cache is copied there at start, once per node, and the
entries an attempt added are copied back by rank 0 at its end, finished or stopped for a requeue, so
the next attempt, on whatever node, starts warm. Entries are only added, each by a rename: a reader
never sees half a file.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path

from hpctrain.config import Config, to_dict
from hpctrain.run.owner import private_dir

log = logging.getLogger("hpctrain")

DIGEST_ENV = "HPCTRAIN_IMAGE_DIGEST"  # the image's digest, where the launcher or the image knows it
DONE = ".hpctrain-copied"


def cache_key(cfg: Config, image_digest: str, torch_version: str) -> str:
    """`<image digest or noimage>-torch<version>-<model config hash>`, safe as one path component."""
    model = json.dumps(
        {"model": to_dict(cfg.model), "compile_mode": cfg.compile.mode, "amp": cfg.train.amp}, sort_keys=True
    )
    digest = re.sub(r"[^A-Za-z0-9._-]", "_", image_digest.removeprefix("sha256:"))[:24] or "noimage"
    version = re.sub(r"[^A-Za-z0-9.+-]", "_", torch_version)
    return f"{digest}-torch{version}-{hashlib.sha256(model.encode()).hexdigest()[:12]}"


def shared_dir(cfg: Config, run_dir: Path, torch_version: str) -> Path:
    base = Path(os.path.expandvars(cfg.compile.cache)).expanduser() if cfg.compile.cache else run_dir / "compile_cache"
    return base / cache_key(cfg, os.environ.get(DIGEST_ENV, ""), torch_version)


def add_new(src: Path, dst: Path) -> int:
    """Copy the files under `src` that `dst` lacks, each through a temporary name and a rename; returns
    how many. Existing files are left alone (Inductor's entries are content-keyed: same name, same use)."""
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


def stage(shared: Path, stage_to: str) -> Path | None:
    """The node-local copy of `shared` under data.stage_to, made once per node (a file lock: the first
    rank copies, the others wait and find it done), in this user's own directory there as the data's
    (data/stage.py); None where that directory is unsafe (another user's, writable by others): the
    ranks then use the shared cache."""
    base = Path(os.path.expandvars(os.path.expanduser(stage_to)))
    udir = base / f"hpctrain-{os.getuid()}"
    base.mkdir(parents=True, exist_ok=True)
    why = private_dir(udir)
    if why:
        log.warning("compile cache: not staged: %s; the ranks use the shared %s", why, shared)
        return None
    local = udir / f"compile-{shared.name}"
    local.mkdir(mode=0o700, exist_ok=True)
    with open(os.open(udir / f".{local.name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        if not (local / DONE).exists():
            n = add_new(shared, local) if shared.is_dir() else 0
            (local / DONE).write_text(str(n))
            log.info("compile cache: %d files copied to node-local %s", n, local)
    return local


class CompileCache:
    """Where this rank's Inductor/Triton caches are, and the copy back of a staged one (`save`)."""

    def __init__(self, shared: Path, local: Path | None):
        self.shared, self.local = shared, local

    @property
    def dir(self) -> Path:
        return self.local or self.shared

    def save(self, is_main: bool) -> None:
        """Rank 0 of a staged cache: the entries this attempt added go back to the shared directory."""
        if self.local is None or not is_main:
            return
        try:
            n = add_new(self.local, self.shared)
        except OSError as e:  # the run's result does not depend on it: say so and go on
            log.warning(
                "compile cache: copying %s back to %s failed (%s): the next attempt compiles again",
                self.local,
                self.shared,
                e,
            )
            return
        log.info("compile cache: %d new files copied back to %s", n, self.shared)

    def report(self) -> None:
        """Inductor's FX graph cache hits and misses in this process (the rank log)."""
        from torch._dynamo.utils import counters  # imported by torch.compile already

        c = counters["inductor"]
        log.info(
            "compile cache %s: FX graph cache %d hits, %d misses",
            self.dir,
            c["fxgraph_cache_hit"],
            c["fxgraph_cache_miss"],
        )


def setup(cfg: Config, run_dir: Path) -> CompileCache | None:
    """Point Inductor and Triton at the run's cache (compile.enabled only; None otherwise), before anything
    is compiled; the FX graph cache on (torch 2.2's default is off)."""
    if not cfg.compile.enabled:
        return None
    import torch  # torch: this module imports light (launch.task → train.entry on the login node)
    import torch._inductor.config as inductor_config  # torch.compile imports it anyway

    shared = shared_dir(cfg, run_dir, torch.__version__)
    shared.mkdir(parents=True, exist_ok=True)
    local = stage(shared, cfg.data.stage_to) if cfg.data.stage_to else None
    cache = CompileCache(shared, local)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache.dir)
    os.environ["TRITON_CACHE_DIR"] = str(cache.dir / "triton")
    inductor_config.fx_graph_cache = True
    log.info("compile cache: %s (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR)", cache.dir)
    return cache

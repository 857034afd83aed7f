"""Which hpctrain a task runs: the code that submitted the job, not a copy frozen in the image.

The recipes install hpctrain into the image, and submitit pickles `train_task` by reference, so
without care every task imports the image's copy: a new config key fails on every rank, a fix
is silently absent, and both report the same version. The batch script binds the submitting
package into the container (`container.source_mount`) ahead of the image's copy on PYTHONPATH
and passes the submitter's source hash; every rank hashes the package it imported and refuses
to train when the two differ. No torch here: the login node hashes too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from hpctrain.errors import LaunchError

SUFFIXES = (".py", ".yaml", ".yml")


def package_dir() -> Path:
    """The directory of the `hpctrain` package this process imported."""
    return Path(__file__).resolve().parent


def source_hash(pkg: Path | None = None) -> str:
    """sha256 over the package's Python and YAML files (relative path + bytes), first 16 hex digits.
    Bytecode caches and other files do not count, so the same sources hash alike everywhere."""
    pkg = pkg or package_dir()
    h = hashlib.sha256()
    for p in sorted(q for q in pkg.rglob("*") if q.suffix in SUFFIXES and "__pycache__" not in q.parts):
        h.update(p.relative_to(pkg).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def check(env: Mapping[str, str]) -> dict[str, str | None]:
    """Compare this process's hpctrain with the submitter's (HPCTRAIN_SOURCE_HASH); the record
    for env.json. Raises LaunchError, before any training, when they differ."""
    running = source_hash()
    submitted = env.get("HPCTRAIN_SOURCE_HASH") or None
    rec = {"running": running, "submitted": submitted, "path": str(package_dir())}
    if submitted and submitted != running:
        raise LaunchError(
            f"this task runs hpctrain from {package_dir()} (source {running}), not the code that submitted "
            f"the job (source {submitted}): the image's copy shadows it, or the checkout changed since "
            "submission; keep container.bind_source on (and the checkout on a file system the nodes "
            "see), then resubmit")
    return rec

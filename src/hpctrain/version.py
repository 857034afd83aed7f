"""`hpctrain --version`: which hpctrain runs — its version, the hash of its sources (the same one a
job compares with the submitter's, `hpctrain.run.source`) and, from a checkout, the git commit;
and the versions of installed distributions, read without importing them.

Nothing heavy is imported: the login node asks this first.
"""

from __future__ import annotations

from importlib import metadata

from hpctrain import __version__
from hpctrain.run.source import commit_of, package_dir, source_hash


def version_line() -> str:
    """`hpctrain 0.1.0 (source 0123456789abcdef, git 0123456789ab) from /path/to/hpctrain`."""
    parts = [f"source {source_hash()}"]
    commit = commit_of(package_dir())
    if commit:
        parts.append(f"git {commit[:12]}{'+modified' if commit.endswith('+modified') else ''}")
    return f"hpctrain {__version__} ({', '.join(parts)}) from {package_dir()}"


def dist_versions(prefix: str) -> dict[str, str]:
    """Installed distributions whose name starts with `prefix` → version (no import of them)."""
    out = {}
    for d in metadata.distributions():
        name = (d.metadata["Name"] or "").lower()
        if name.startswith(prefix):
            out[name] = d.version
    return out

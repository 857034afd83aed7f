"""`hpctrain --version`: which hpctrain runs — its version, the hash of its sources (the same one a
job compares with the submitter's, `hpctrain.source`) and, from a checkout, the git commit.

Nothing heavy is imported: the login node asks this first.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from hpctrain import __version__
from hpctrain.source import package_dir, source_hash


def checkout_root(pkg: Path | None = None) -> Path | None:
    """The checkout that holds this package (`<root>/src/hpctrain` with `<root>/pyproject.toml`),
    or None for an installed copy (a wheel in site-packages, a snapshot)."""
    pkg = pkg or package_dir()
    root = pkg.parent.parent
    if pkg.parent.name == "src" and (root / "pyproject.toml").is_file():
        return root
    return None


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
    commit = git("rev-parse", "--short=12", "HEAD")
    if not commit:
        return None
    changed = git("status", "--porcelain", "--untracked-files=no")
    return f"{commit}+modified" if changed else commit


def version_line() -> str:
    """`hpctrain 0.1.0 (source 0123456789abcdef, git 0123456789ab) from /path/to/hpctrain`."""
    parts = [f"source {source_hash()}"]
    root = checkout_root()
    commit = git_commit(root) if root else None
    if commit:
        parts.append(f"git {commit}")
    return f"hpctrain {__version__} ({', '.join(parts)}) from {package_dir()}"

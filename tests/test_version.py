"""`hpctrain --version`: version, source hash, and the git commit only from a checkout."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from hpctrain import __version__
from hpctrain.run.source import checkout_root, git_commit, source_hash
from tests.helpers import hpctrain

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not shutil.which("git") or not (ROOT / ".git").exists(), reason="needs git and a checkout")
def test_version_from_a_checkout_names_source_hash_and_commit(tmp_path):
    r = hpctrain("--version", cwd=tmp_path)  # any directory: the package's own checkout counts
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"hpctrain {__version__} (source {source_hash()}, git {head}")
    assert r.stdout.rstrip().endswith(f") from {ROOT / 'src' / 'hpctrain'}")


def test_an_installed_copy_names_no_commit(tmp_path):
    """A package outside `<root>/src` (site-packages, a snapshot) is no checkout, even inside a git
    repository (a venv in someone's project), and git missing or failing names nothing."""
    pkg = tmp_path / "lib" / "site-packages" / "hpctrain"
    pkg.mkdir(parents=True)
    assert checkout_root(pkg) is None
    if shutil.which("git"):
        subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "src").mkdir()
    (tmp_path / "pyproject.toml").write_text("")
    assert checkout_root(tmp_path / "src" / "hpctrain") == tmp_path
    assert git_commit(tmp_path) is None  # a repository without a commit
    assert git_commit(tmp_path / "lib") is None  # not the top of the work tree

"""The session's temp directories stay reachable by the Slurm tests' ordinary users while other pytest
sessions start on the machine.

Every pytest session that starts takes group and other bits off `/tmp/pytest-of-<user>` (pytest does,
for privacy). The Slurm tests' users reach their jobs' directories through the session's basetemp
(tests/site_users.py, `reach`): under `/tmp/pytest-of-root`, a fast tier started beside CI cut them
off mid-job (EACCES on metrics.jsonl, heartbeats, checkpoints; issue 56). The session's basetemp is
under a root of its own (tests/conftest.py, `pytest_configure`), which no other session touches."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path


def _above(base: Path) -> list[Path]:
    """`base` and the directories above it, up to (not with) the machine's temp directory."""
    top = Path(tempfile.gettempdir()).resolve()
    return [d for d in [base, *base.parents] if d != top and top in d.parents]


def test_another_pytest_session_leaves_the_site_users_their_way_in(tmp_path_factory, tmp_path):
    base = tmp_path_factory.getbasetemp().resolve()
    above = _above(base)
    assert above, base
    modes = {d: stat.S_IMODE(d.stat().st_mode) for d in above}
    try:
        for d in above:  # as `reach` opens them for the users
            d.chmod(modes[d] | stat.S_IXOTH)
        other = tmp_path / "other"
        other.mkdir()
        (other / "test_one.py").write_text("def test_one(tmp_path):\n    assert tmp_path.is_dir()\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
        r = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "test_one.py"],
            cwd=other,
            env=env,
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stdout + r.stderr  # a session that made its basetemp, as pytest does
        shut = [d for d in above if not d.stat().st_mode & stat.S_IXOTH]
        assert not shut, f"another pytest session took the search bit off {shut}"
    finally:
        for d, mode in modes.items():
            d.chmod(mode)

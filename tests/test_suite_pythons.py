"""The suite runs the Python it was started with, whatever the machine's other Pythons hold.

A test that stands in for an image (a fake container's `python3`, a notebook job's interpreter) must
start this Python with this Python's packages. A link to a venv's `python` does not: Python finds
the venv's pyvenv.cfg beside the name it was started by, so a link elsewhere starts the base
interpreter with the base's packages. CI installed into its base Python, where that is the same set;
a user who runs the suite from the README's venv got `No module named 'submitit.core'` in the tasks
(issue 56). `tests.helpers.this_python_as` writes a launcher instead."""

from __future__ import annotations

import ast
import subprocess
import sys
import venv
from pathlib import Path

from tests.helpers import this_python_as

TESTS = Path(__file__).resolve().parent
PREFIX = "import sys; print(sys.prefix)"


def test_a_link_to_a_venvs_python_starts_the_base_interpreter(tmp_path):
    venv.EnvBuilder(with_pip=False, symlinks=True).create(tmp_path / "v")
    (tmp_path / "img").mkdir()
    link = tmp_path / "img" / "python3"
    link.symlink_to(tmp_path / "v" / "bin" / "python")
    by_name = subprocess.run(["env", "-i", str(tmp_path / "v" / "bin" / "python"), "-c", PREFIX], capture_output=True)
    by_link = subprocess.run(["env", "-i", str(link), "-c", PREFIX], capture_output=True)
    assert by_name.stdout.decode().strip() == str(tmp_path / "v")
    assert by_link.stdout.decode().strip() == sys.base_prefix  # the venv is gone, and its packages


def test_this_python_as_starts_this_python_with_its_packages(tmp_path):
    python3 = this_python_as(tmp_path / "img" / "python3")
    (tmp_path / "run" / "submitit").mkdir(parents=True)  # a run directory's submitit/ folder, as a task's cwd
    r = subprocess.run(
        ["env", "-i", str(python3), "-c", f"{PREFIX}; from submitit.core import job_environment"],
        cwd=tmp_path / "run",
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and r.stdout.strip() == sys.prefix, r.stderr


def test_no_test_links_to_this_python():
    """`symlink_to(sys.executable)` / `os.symlink(sys.executable, …)` in tests/ or bench/: use
    this_python_as (a link is the base interpreter when this Python is a venv's)."""
    found = []
    for path in [*TESTS.rglob("*.py"), *(TESTS.parent / "bench").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name in ("symlink_to", "symlink") and "sys.executable" in ast.unparse(node.args[0]):
                found.append(f"{path.relative_to(TESTS.parent)}:{node.lineno}")
    assert not found, found

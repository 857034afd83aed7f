"""mypy on src/ (settings in pyproject.toml) finds nothing beyond tests/mypy_baseline.txt, and the
baseline lists nothing mypy no longer finds: it only shrinks (CONTRIBUTING.md).

Findings are compared without line numbers (file, code, message; counted), so moving code does not
churn the baseline. After fixing findings: `python -m tests.test_types --write`. mypy reads no installed
package (pyproject.toml: no_site_packages), so the findings are the same whichever extras are installed."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers import ROOT

BASELINE = ROOT / "tests" / "mypy_baseline.txt"
FINDING = re.compile(r"^(?P<file>[^:]+):\d+: error: (?P<msg>.*?)\s+\[(?P<code>[a-z-]+)\]$")


def findings(cache_dir: Path, *files: Path) -> Counter[str]:
    """mypy's findings on src/ (or on `files`, under the same settings)."""
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(cache_dir)]
        + ["--no-error-summary", *map(str, files)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if out.returncode not in (0, 1):
        raise RuntimeError(f"mypy failed to run (exit {out.returncode}): {out.stderr or out.stdout}")
    return Counter(
        f"{m['file']}: [{m['code']}] {m['msg']}" for line in out.stdout.splitlines() if (m := FINDING.match(line))
    )


def read_baseline() -> Counter[str]:
    return Counter(line for line in BASELINE.read_text().splitlines() if line and not line.startswith("#"))


def test_mypy_finds_nothing_new_and_the_baseline_only_shrinks(tmp_path):
    pytest.importorskip("mypy")
    now, baseline = findings(tmp_path / "mypy-cache"), read_baseline()
    new, fixed = now - baseline, baseline - now
    assert not new, "mypy finds what the baseline does not have (fix it):\n" + "\n".join(sorted(new.elements()))
    assert not fixed, (
        "fixed, still in tests/mypy_baseline.txt (run `python -m tests.test_types --write`):\n"
        + "\n".join(sorted(fixed.elements()))
    )


def test_an_installed_package_s_own_types_do_not_count(tmp_path):
    """numpy ships .pyi stubs: were they read, `np.zeros` would be an ndarray and the first line a finding,
    present only where numpy is installed (the baseline then listed DALI's, numpy's and matplotlib's
    findings as "fixed" in a venv without them). The second line shows that mypy did check the file."""
    pytest.importorskip("mypy")
    pytest.importorskip("numpy", reason="shown with an installed package that has stubs")
    module = tmp_path / "uses_numpy.py"
    module.write_text('import numpy as np\n\nx: int = np.zeros(3)\ny: int = "not an int"\n')
    wrong = 'Incompatible types in assignment (expression has type "str", variable has type "int")'
    assert findings(tmp_path / "mypy-cache", module) == Counter([f"{module}: [assignment] {wrong}"])


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    with tempfile.TemporaryDirectory() as cache:
        found = findings(Path(cache))
    BASELINE.write_text(
        "# mypy findings on src/ accepted when the checker came in; this list only shrinks.\n"
        + "".join(f"{line}\n" for line in sorted(found.elements()))
    )
    print(f"{sum(found.values())} findings in {len({k.split(':')[0] for k in found})} files")

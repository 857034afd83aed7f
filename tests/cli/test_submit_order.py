"""`hpctrain submit` refuses bad input first, whatever the working directory holds.

README command 1 leaves a finished `runs/digits_vit` in the directory a user works in; a second
submission of the same config is noted as finished, but a config or profile error must still be
the one line the user sees (it was preceded by the finished-run note).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import DIGITS, hpctrain


def finished_demo_run(cwd: Path) -> Path:
    """What README command 1 leaves in `cwd`: runs/digits_vit ended `finished`, its checkpoint there."""
    run = cwd / "runs" / "digits_vit"
    (run / "checkpoints").mkdir(parents=True)
    cfg = subprocess.run(
        [sys.executable, "-m", "hpctrain", "config", "--config", str(DIGITS)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (run / "config.yaml").write_text(cfg)
    (run / "checkpoints" / "step-00000660.pt").write_bytes(b"x")
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "end", "status": "finished", "step": 660}) + "\n")
    return run


def test_a_bad_profile_is_refused_alone_beside_a_finished_run(tmp_path):
    finished_demo_run(tmp_path)
    ok = hpctrain("submit", "--config", "configs/digits_vit.yaml", "--dry-run", cwd=tmp_path)
    assert ok.returncode == 0 and "note: " in ok.stderr and "finished" in ok.stderr, ok.stderr  # the state is seen
    r = hpctrain(
        "submit",
        "--config",
        "configs/digits_vit.yaml",
        "--cluster-set",
        "container.runtime=docker",
        "--dry-run",
        cwd=tmp_path,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "container.runtime='docker' is not one of" in r.stderr

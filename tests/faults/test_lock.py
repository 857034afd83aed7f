"""Two jobs pointed at one run directory: the second refuses to start, the first is unharmed."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.faults.local import last_step, start_ranks, wait_for_step
from tests.helpers import digits_args


def test_second_job_refused_first_unharmed(digits_root, tmp_path):
    first = start_ranks(1, digits_root, tmp_path, "shared", "train.max_steps=60")
    run = tmp_path / "shared"
    wait_for_step(run, 3, first)
    config_before = (run / "config.yaml").read_bytes()
    r = subprocess.run([sys.executable, *digits_args(digits_root, tmp_path, "shared", "train.max_steps=60",
                                                      "optim.lr=0.5")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert f"run directory {run} is in use by" in r.stderr and f'"pid": {first[0].pid}' in r.stderr
    assert (run / "config.yaml").read_bytes() == config_before
    step = last_step(run)
    out, _ = first[0].communicate(timeout=300)
    assert first[0].returncode == 0, out[-2000:]
    assert last_step(run) == 60 > step and re.search(r"status +finished", out)
    # the lock dies with its holder: a later job may take the directory over
    r = subprocess.run([sys.executable, *digits_args(digits_root, tmp_path, "shared", "train.max_steps=60")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]

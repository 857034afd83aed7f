"""The plan's predictions against what the test suite's Slurm jobs did (bench/plan_calibration.py).

With $HPCTRAIN_PLAN_CALIBRATION set to a file, a test cluster appends, before it stops (sacct still
answers), one JSON line per run directory its jobs trained under the session's temp directory: the
run's `plan vs reality` rows (`hpctrain goodput --json`'s `plan`) and its ratios.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from hpctrain.run.layout import METRICS, PLAN

ENV = "HPCTRAIN_PLAN_CALIBRATION"


def collect(cluster, base: Path) -> int:
    """Append the rows of every run under `base` that has a plan; returns how many runs."""
    out = os.environ.get(ENV)
    if not out:
        return 0
    n = 0
    for plan in sorted(base.rglob(PLAN)):
        run = plan.parent
        if not (run / METRICS).is_file():
            continue
        r = cluster.run(sys.executable, "-m", "hpctrain", "goodput", str(run), "--json", check=False)
        if r.returncode != 0:
            continue
        led = json.loads(r.stdout)
        row = {"run": run.name, "slurm": cluster.version(), "plan": led["plan"], "goodput": led["goodput"]}
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
        n += 1
    return n

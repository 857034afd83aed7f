"""The plan's calibration on this machine: what `hpctrain submit` predicted (<run>/plan.json) against
what the test suite's Slurm jobs did, one table (docs/plan.md, "Plan vs reality").

    python bench/plan_calibration.py [--out FILE] [TEST ...]

Runs the given Slurm tests (default: a set that submits jobs of several shapes and faults) with
$HPCTRAIN_PLAN_CALIBRATION set (tests/plan_calibration.py: the test cluster appends each run's rows
before it stops), then prints per figure: the runs with a prediction, the median predicted, the median
actual and the median relative error, and the runs whose plan had no figure (with the plan's reason).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
TESTS = (
    "tests/faults/test_goodput_job.py",
    "tests/faults/test_rank_crash.py",
    "tests/faults/test_stop_signals.py",
    "tests/launch/test_submit_budget.py",
)


def table(rows: list[dict]) -> str:
    figures: dict[str, list[dict]] = {}
    for row in rows:
        for f in row["plan"]:
            figures.setdefault(f["figure"], []).append(f)
    lines = [
        f"{len(rows)} runs of the test suite's Slurm jobs",
        f"{'figure':<20} {'predicted in':>12} {'median predicted':>17} {'median actual':>14} {'median error':>13}",
    ]
    for name, fs in figures.items():
        known = [f for f in fs if f["predicted"] is not None]
        actual = [f["actual"] for f in fs if f["actual"] is not None]
        rel = [f["relative"] for f in known if f["relative"] is not None]

        def med(v: list) -> str:
            return "-" if not v else f"{statistics.median(v):,.2f}"

        err = "-" if not rel else f"{100 * statistics.median(rel):+.0f} %"
        lines.append(
            f"{name:<20} {f'{len(known)} of {len(fs)}':>12} {med([f['predicted'] for f in known]):>17} "
            f"{med(actual):>14} {err:>13}"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tests", nargs="*", default=list(TESTS))
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        rows_file = Path(d) / "rows.jsonl"
        env = {**os.environ, "HPCTRAIN_PLAN_CALIBRATION": str(rows_file)}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slurm", *args.tests]
        rc = subprocess.run(cmd, cwd=HERE, env=env).returncode
        rows = [json.loads(line) for line in rows_file.read_text().splitlines()] if rows_file.exists() else []
    text = table(rows) + f"\n(pytest exit status {rc}: {' '.join(args.tests)})"
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())

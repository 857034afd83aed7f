"""`hpctrain goodput RUN_OR_JOB [--json]`: where every second of the run went (run/goodput.py).

From its first submission to its end (or now): queue waits (sacct), start-ups by phase, productive
training, blocking checkpoints, evals, progress lost to restarts and the restarts' downtime, data
wait, straggler excess, and idle time by name; goodput, runtime goodput and ETTR
(docs/observability.md, "Goodput").
"""

from __future__ import annotations

import argparse
import json

from hpctrain.cli import CLIError
from hpctrain.run import goodput
from hpctrain.watch.jobinfo import where_of
from hpctrain.watch.ledger import run_ledger
from hpctrain.watch.lookup import resolve


def add_parser(sub) -> None:
    p = sub.add_parser(
        "goodput",
        help="where a run's time went: queue, start-up, training, checkpoints, restarts (goodput, ETTR)",
        description=__doc__,
    )
    p.add_argument("target", metavar="RUN_OR_JOB", help="run directory (runs/<name>) or Slurm job id")
    p.add_argument("--json", action="store_true", help="print one JSON object (seconds per category, parts, ratios)")
    p.set_defaults(func=goodput_cmd)


def goodput_cmd(args: argparse.Namespace) -> int:
    run_dir, job_id, executor = resolve(args.target)
    if run_dir is None:
        raise CLIError(f"no run directory found for {args.target}: give runs/<name>, or the job id of a started job")
    records = goodput.run_records(run_dir)
    ledger = run_ledger(records, job_id if executor == "slurm" else None, where_of(run_dir))
    if not ledger.attempts:
        raise CLIError(
            f"{run_dir} has no start-up record yet (its first step has not been taken, or it was trained by an "
            "hpctrain before 0.5): nothing to add up; try again once it trains (hpctrain status)"
        )
    plan = goodput.plan_vs_actual(run_dir, ledger, records)
    if args.json:
        print(json.dumps({"run_dir": str(run_dir), "job_id": job_id, **ledger.to_json(), "plan": plan}, indent=1))
    else:
        print(f"hpctrain goodput: {run_dir}" + (f" (job {job_id})" if job_id else ""))
        print(goodput.table(ledger))
        if plan:
            print(goodput.plan_table(plan))
    return 0

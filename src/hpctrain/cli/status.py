"""`hpctrain status RUN_OR_JOB [--json]` and `hpctrain logs RUN_OR_JOB [-f [--poll S]] [--rank R]`."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from hpctrain.cli import CLIError
from hpctrain.launch.sweep import SWEEP_FILE, is_sweep, sweep_table
from hpctrain.launch.sweep import sweep_status as rows_of
from hpctrain.run.layout import RUNS, read_json
from hpctrain.watch.follow import add_poll_arg, pace_of
from hpctrain.watch.logs import follow, has_ended, log_path, wait_for_run
from hpctrain.watch.render import status_text
from hpctrain.watch.summary import run_status


def add_parser(sub) -> None:
    p = sub.add_parser(
        "status",
        help="state, progress, ETA, speed, straggler, last eval and checkpoint of a "
        "run or Slurm job; a sweep: one table of its runs",
        description=__doc__,
    )
    p.add_argument(
        "target",
        metavar="RUN_OR_JOB",
        help="run directory (runs/<name>), Slurm job id, or a sweep (runs/<sweep> or its name: one table)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (machine names) for scripts")
    p.set_defaults(func=status)
    p = sub.add_parser("logs", help="print (or follow) the log of rank 0 or a chosen rank", description=__doc__)
    p.add_argument("target", metavar="RUN_OR_JOB", help="run directory (runs/<name>) or Slurm job id")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    p.add_argument("--rank", type=int, default=0, help="which rank's log (default 0)")
    add_poll_arg(p, "-f")
    p.set_defaults(func=logs)


def status(args: argparse.Namespace) -> int:
    if not is_sweep(args.target) and not args.target.isdigit() and is_sweep(f"runs/{args.target}"):
        args.target = f"runs/{args.target}"  # a sweep's name under the default run.dir
    if is_sweep(args.target):
        return sweep_status(args)

    st = run_status(args.target)
    if args.json:
        print(json.dumps(strict_json(st.facts()), indent=1))
    else:
        print(status_text(st))
    return 1 if st.state in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY") else 0


def strict_json(v):
    """NaN and infinities (a diverged loss) as null: JSON has no such numbers, and jq refuses them."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: strict_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [strict_json(x) for x in v]
    return v


def sweep_status(args: argparse.Namespace) -> int:
    """One row per member of a sweep (sweep.json), best val top-1 first."""
    rows = rows_of(args.target)
    if args.json:
        print(json.dumps({"sweep": str(Path(args.target).resolve()), "runs": rows}, indent=1))
    else:
        print(sweep_table(rows, f"hpctrain status: sweep {Path(args.target).resolve().name} ({len(rows)} runs)"))
    bad = ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
    return 1 if any(r["state"] in bad for r in rows) else 0


def logs(args: argparse.Namespace) -> int:
    for sweep in (Path(args.target), RUNS / args.target):
        if is_sweep(sweep):  # one log per member: name one
            members = [m["run_dir"] for m in read_json(sweep / SWEEP_FILE, {}).get("members", []) if m.get("run_dir")]
            raise CLIError(
                f"{args.target} is a sweep of {len(members)} runs, each with its own logs: name one, e.g. "
                f"hpctrain logs {members[0] if members else sweep / '<run>'} (all of them: hpctrain "
                f"status {args.target})"
            )
    pace = pace_of(args.poll, args.follow, "-f")
    if args.follow:  # the files first; Slurm asked at the pace, and not while they grow (watch/follow.py)
        run_dir, job_id, executor = wait_for_run(args.target, pace)
        path = log_path(str(run_dir) if run_dir else args.target, args.rank)
        follow(path, has_ended(run_dir, job_id, executor, path, pace))
        return 0
    path = log_path(args.target, args.rank)
    if not path.exists():
        raise CLIError(
            f"no log at {path} yet: the job may not have started (hpctrain status "
            f"{args.target}), or rank {args.rank} does not exist"
        )
    print(path.read_text(errors="replace"), end="")
    return 0

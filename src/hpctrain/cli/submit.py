"""`hpctrain submit`: start the training job (Slurm when a controller answers, else locally)."""

from __future__ import annotations

import argparse

from hpctrain.cli import add_config_args
from hpctrain.cli.common import DEFAULT_CONFIG


def add_parser(sub) -> None:
    p = sub.add_parser("submit", help="submit the training job (Slurm, or locally with 2 processes)",
                       description=__doc__)
    add_config_args(p, default=DEFAULT_CONFIG)
    p.add_argument("--local-tasks", type=int, default=2, help="processes for a local run (default 2)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from hpctrain.cli import CLIError
    from hpctrain.cli.common import load_config
    from hpctrain.config import check_batch
    from hpctrain.data.prepare import ensure_dataset
    from hpctrain.launch.submit import submit_local, wait_local
    from hpctrain.train.entry import summary_table

    cfg = load_config(args.config, args.overrides, DEFAULT_CONFIG)
    if args.local_tasks < 1:
        raise CLIError(f"--local-tasks={args.local_tasks}: need at least 1 process")
    check_batch(cfg, args.local_tasks)
    ensure_dataset(cfg)
    sub = submit_local(cfg, tasks=args.local_tasks)
    print(f"submitted local job {sub.job_id} ({args.local_tasks} processes)")
    print(f"run directory: {sub.run_dir}")
    print(f"follow the logs: {sub.log_hint}", flush=True)
    results = wait_local(sub)
    summary = results[0]
    print(summary_table(summary))
    if summary.get("top1") is not None:
        print(f"final val top-1: {summary['top1']:.2f} % ({summary['val_count']} images)")
    return 0 if summary["status"] == "finished" else 1

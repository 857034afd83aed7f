"""`hpctrain train`: run training in this process (alone, under torchrun, or as an srun task)."""

from __future__ import annotations

import argparse

from hpctrain.cli import add_config_args


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train in this process (or under torchrun / srun)",
                       description=__doc__)
    add_config_args(p)
    p.add_argument("--resume", help="auto (newest checkpoint that loads), none, or a checkpoint path")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from hpctrain.cli.common import load_config
    from hpctrain.data.prepare import ensure_dataset
    from hpctrain.launch.requeue import check_budget
    from hpctrain.train.entry import run

    check_budget()  # a job Slurm requeued too often (node failures) stops here

    overrides = list(args.overrides) + ([f"run.resume={args.resume}"] if args.resume else [])
    cfg = load_config(args.config, overrides)
    ensure_dataset(cfg)
    summary = run(cfg)
    from hpctrain.launch.requeue import after_stop

    if after_stop(summary, summary["rank"]):  # rank 0 requeued the Slurm job: it resumes there
        return 0
    return 0 if summary["status"] in ("finished", "halted", "preempted") else 1

"""`hpctrain train`: run training in this process (alone, under torchrun, or as an srun task)."""

from __future__ import annotations

import argparse
import os
import sys

from hpctrain.cli import add_config_args
from hpctrain.cli.common import load_config
from hpctrain.data.prep.prepare import ensure_dataset
from hpctrain.train import stop as stopmod


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train in this process (or under torchrun / srun)", description=__doc__)
    add_config_args(p)
    p.add_argument("--resume", help="auto (newest checkpoint that loads), none, or a checkpoint path")
    # tests: checkpoint and stop at this step as if preempted (HPCTRAIN_HALT_AT); not a setting
    p.add_argument("--halt-at", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    stop = stopmod.install(interrupt=True)  # first: a USR2/TERM/Ctrl-C from here on stops at a step boundary
    overrides = list(args.overrides) + ([f"run.resume={args.resume}"] if args.resume else [])
    if args.halt_at is not None:
        os.environ[stopmod.HALT_AT_ENV] = str(args.halt_at)
    cfg = load_config(args.config, overrides)
    ensure_dataset(cfg)
    # torch: after the stop handlers and the config's checks, as entry.run imported it before; `hpctrain
    # --help` lists this command on a login node without torch
    from hpctrain.train.entry import run

    summary = run(cfg, stop)
    if summary["status"] == "interrupted":
        if summary["rank"] == 0:
            print(
                f"hpctrain: interrupted: stopped at step {summary['step']}"
                + (f", checkpoint {summary['checkpoint']}" if summary.get("checkpoint") else "")
                + "; run the same command again to resume",
                file=sys.stderr,
            )
        return 130
    # stopped: the batch shell reads rank 0's decision (requeue or end) from $HPCTRAIN_STOP_FILE
    return 0 if summary["status"] in ("finished", "halted", "preempted") else 1

"""`--poll S`: how often a command that follows a Slurm job asks the controller (watch/follow.py)."""

from __future__ import annotations

import argparse

from hpctrain.cli import CLIError
from hpctrain.watch.follow import FLOOR_S, Pace, pace_of


def add_poll_arg(p, follows: str) -> None:
    """--poll on a command whose `follows` flag (--wait, -f) follows a Slurm job."""
    p.add_argument(
        "--poll",
        type=float,
        metavar="S",
        help=f"with {follows}: ask Slurm every S seconds (at least {FLOOR_S:g}; default: at 5, 15 and 30 s, then every "
        "minute: <= 2 calls a minute), and never while the run's files grow",
    )


def poll_pace(args: argparse.Namespace, following: bool, follows: str) -> Pace:
    """The pace of `args.poll` (one-line errors: below the floor, or without `follows`)."""
    if args.poll is not None and not following:
        raise CLIError(f"--poll sets how often {follows} asks Slurm: add {follows}, or drop --poll")
    try:
        return pace_of(args.poll)
    except ValueError as e:
        raise CLIError(str(e)) from None

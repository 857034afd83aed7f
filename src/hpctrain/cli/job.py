"""What the commands that submit a job share (`submit`, `sweep`, `eval --nodes`): the job flags,
their Request, and printing a prepared job's lines. A module of its own, so that the commands
that submit nothing (cli.common's users: `train`, `plan`, ...) do not load the submission path.
No command module imports another (tests/test_import_graph.py): what they share is here."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from typing import TextIO

from hpctrain import node_range
from hpctrain.errors import LaunchError
from hpctrain.launch.prepare import Message
from hpctrain.launch.submit import Request, Submission, parse_ranks


def node_arg(text: str | None) -> node_range.NodeRange | None:
    """`--nodes 16` or `--nodes 12-16` (None: not given); LaunchError, one line with the fix, otherwise."""
    if text is None:
        return None
    try:
        return node_range.parse(text)
    except ValueError as e:
        raise LaunchError(str(e)) from None


def add_job_args(p: argparse.ArgumentParser, nodes_help: str) -> None:
    """The job's resources and cluster profile (an argument group is as good as the parser)."""
    p.add_argument(
        "--cluster", help="cluster profile: a path or a name in configs/clusters (default $HPCTRAIN_CLUSTER)"
    )
    p.add_argument(
        "--cluster-set",
        dest="cluster_overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a profile value, e.g. container.runtime=none",
    )
    p.add_argument(
        "--local",
        action="store_true",
        help="run on this machine (local processes), even where Slurm is configured; without it a job "
        "runs here only on a machine with no Slurm (no sbatch, or no slurm.conf)",
    )
    p.add_argument("--nodes", metavar="N|MIN-MAX", help=nodes_help)
    p.add_argument("--gpus-per-node", type=int, help="GPUs = tasks per node (default: the profile's)")
    p.add_argument("--time", help="wall-clock limit, e.g. 24:00:00")
    for opt in ("partition", "account", "qos", "constraint"):
        p.add_argument(f"--{opt}", help=f"Slurm {opt} (default: the profile's)")
    p.add_argument("--exclusive", action="store_true", default=None, help="whole nodes only")


def request(args: argparse.Namespace) -> Request:
    """The Request of the job flags (add_job_args', or a sweep's own)."""
    nsys = getattr(args, "nsys_ranks", None)
    nodes = node_arg(args.nodes)
    return Request(
        nodes=None if nodes is None else nodes.hi,
        min_nodes=None if nodes is None or nodes.fixed else nodes.lo,
        gpus_per_node=args.gpus_per_node,
        time=args.time,
        partition=args.partition,
        account=args.account,
        qos=args.qos,
        constraint=args.constraint,
        exclusive=args.exclusive,
        spare_nodes=getattr(args, "spare_nodes", None),
        nsys_ranks=parse_ranks(nsys) if nsys else (),
    )


def show(messages: Iterable[Message], out: TextIO) -> None:
    """A prepared job's lines: `info` on `out`, notes and warnings on stderr with their prefix."""
    for m in messages:
        if m.level == "info":
            print(m.text, file=out)
        else:
            print(f"hpctrain: {m.level}: {m.text}", file=sys.stderr)
    out.flush()


def goes_on(sub: Submission, how_to_end: str) -> int:
    """A Ctrl-C while following a Slurm job: the job is Slurm's, not this process's, so it goes on;
    say how to follow and end it (`how_to_end`: the scancel lines that fit this kind of job)."""
    print(
        f"\nhpctrain: stopped waiting; Slurm job {sub.job_id} goes on. Follow it: {sub.log_hint}   {how_to_end}",
        file=sys.stderr,
    )
    return 130

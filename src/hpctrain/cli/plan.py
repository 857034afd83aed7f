"""`hpctrain plan`: per-GPU batch, images/s, step time split, epoch and total time, GPU-hours and
scaling efficiency of a job before it is submitted; then, from the cluster's own record, the queue
wait, the work lost to interruptions, the time to result and the share of the allocation per node
count, and the node count to ask for (no torch: runs on login nodes)."""

from __future__ import annotations

import argparse
import json
import os

from hpctrain import node_range
from hpctrain import plan as planmod
from hpctrain.cli import add_config_args
from hpctrain.cli.common import DEFAULT_CONFIG, load_config
from hpctrain.node_range import NodeRange
from hpctrain.plan import ranges, recommend
from hpctrain.plan.queue import HISTORY_DAYS
from hpctrain.plan.ranges import DEFAULT_GPU_MEM_GB
from hpctrain.site.profile import load_profile


def add_parser(sub) -> None:
    p = sub.add_parser(
        "plan", help="predict images/s, step time, wall time and GPU-hours of a job", description=__doc__
    )
    add_config_args(p, default=DEFAULT_CONFIG)
    p.add_argument(
        "--nodes",
        type=node_list,
        default=[1],
        metavar="N[,N...]|MIN-MAX",
        help="nodes, the node counts to compare (4,8,16), or a range MIN-MAX (12-16: its time to result "
        "against a fixed MAX; default 1)",
    )
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: the profile's)")
    p.add_argument(
        "--cluster",
        help="cluster profile: its fabric.kind picks the network figure, its "
        "partition the queue (default $HPCTRAIN_CLUSTER, else local; none: "
        "read no queue)",
    )
    p.add_argument("--partition", help="partition whose queue is read (default: the profile's, else Slurm's default)")
    p.add_argument("--account", help="account whose allocation is read (default: the profile's, else yours)")
    p.add_argument(
        "--history-days",
        type=float,
        default=HISTORY_DAYS,
        help=f"days of sacct history for queue waits and interruptions (default {HISTORY_DAYS:g}, as submit's)",
    )
    p.add_argument(
        "--cluster-set",
        dest="cluster_overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a profile value, e.g. fabric.kind=roce",
    )
    p.add_argument("--gpu", default="H100", help="GPU model for the shipped figures (default H100)")
    p.add_argument(
        "--bench-results", metavar="FILE", help="`hpctrain bench --json` output from the target GPU (compute per GPU)"
    )
    p.add_argument(
        "--allreduce-results",
        metavar="FILE",
        help="`hpctrain doctor --allreduce --json` output from the target nodes (bus bandwidth)",
    )
    p.add_argument(
        "--gpu-mem-gb",
        type=float,
        metavar="GB",
        help=f"memory of one GPU, for a node range's accumulation (default {DEFAULT_GPU_MEM_GB:g}, as submit's)",
    )
    p.add_argument("--tflops", type=float, help="achieved model TFLOP/s per GPU (overrides the above)")
    p.add_argument("--busbw", type=float, help="all-reduce bus bandwidth in GB/s (overrides the above)")
    p.add_argument("--data-wait-ms", type=float, help="data wait per step at --nodes (default 0)")
    p.add_argument(
        "--images-per-epoch",
        type=int,
        help="training images per epoch (default: ImageNet-1k for 1000 classes, else counted under data.root)",
    )
    p.add_argument(
        "--no-overlap",
        dest="overlap",
        action="store_false",
        help="all-reduce after backward instead of overlapping it (as DDP does)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=main)


def node_list(text: str) -> list[int] | NodeRange:
    """`4` or `4,8,16` → node counts; `12-16` → a NodeRange (argparse turns the ValueError into a
    one-line usage error, and prints an ArgumentTypeError's own text: node_range's, with the fix)."""
    if "-" in text and "," not in text:
        try:
            return node_range.parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    counts = [int(x) for x in text.split(",") if x.strip()]
    if not counts or min(counts) < 1:
        raise ValueError(text)
    return sorted(set(counts))


# argparse's "invalid <name> value"
node_list.__name__ = "node count, comma-separated list (e.g. 4,8,16) or range (e.g. 12-16)"


def main(args: argparse.Namespace) -> int:
    if not args.history_days > 0:
        raise planmod.PlanError(f"--history-days {args.history_days:g}: give a positive number of days, e.g. 7")
    cfg = load_config(args.config, args.overrides, DEFAULT_CONFIG)
    cluster = args.cluster or os.environ.get("HPCTRAIN_CLUSTER") or "local"
    profile = load_profile("local" if cluster == "none" else cluster, args.cluster_overrides)
    gpn = args.gpus_per_node if args.gpus_per_node is not None else profile.slurm.gpus_per_node
    span = args.nodes if isinstance(args.nodes, NodeRange) and not args.nodes.fixed else None
    counts = [args.nodes.hi] if isinstance(args.nodes, NodeRange) else args.nodes
    target = counts[-1]
    inputs = planmod.resolve(
        cfg,
        profile,
        target,
        gpn,
        gpu=args.gpu,
        bench_results=args.bench_results,
        allreduce_results=args.allreduce_results,
        tflops=args.tflops,
        busbw=args.busbw,
        data_wait_ms=args.data_wait_ms,
        images=args.images_per_epoch,
        overlap=args.overlap,
        counts=counts if len(counts) > 1 else (),
    )
    plan = planmod.build(cfg, inputs)
    ctx = (
        recommend.no_context("--cluster none")
        if cluster == "none"
        else recommend.read_context(profile, args.partition or "", args.history_days, args.account or "")
    )
    rp = ranges.plan_range(cfg, profile, inputs, ctx, span, args.gpu_mem_gb) if span else None
    opts = rp.options if rp else recommend.options(cfg, profile, plan, ctx, gpn)
    choose = ranges.choose if rp else None
    site = bool(args.cluster or os.environ.get("HPCTRAIN_CLUSTER"))
    # without a site profile the figures are this machine's (profile `local`): a node count for a
    # cluster is not recommended from them
    withheld = "" if site else "no site profile (--cluster NAME or $HPCTRAIN_CLUSTER): the figures are this machine's"
    source = f"machine figures: profile {profile.name}" + ("" if site else " (the default: this machine)")
    if args.json:
        out = {**planmod.to_dict(cfg, inputs, plan), **recommend.to_json(opts, ctx, withheld, choose)}
        if rp:
            choice = None if withheld else ranges.choose(opts)[0]
            out["range"] = ranges.to_json(rp, choice)
        print(json.dumps({**out, "profile": profile.name, "site_profile": site}))
    else:
        print(planmod.describe(cfg, inputs, plan))
        print(source)
        print()
        lines = recommend.table(opts, ctx, withheld, choose)
        if rp:  # what the two rows' training rests on, under the step model's line
            at = next(i for i, ln in enumerate(lines) if ln.startswith("  train:")) + 1
            lines[at:at] = ranges.source_lines(rp)
        print("\n".join(lines))
    return 0

"""`hpctrain doctor`: versions, GPUs, InfiniBand, NCCL environment and container sanity."""

from __future__ import annotations

import argparse
import json
import os

from hpctrain import allreduce
from hpctrain.cli import CLIError
from hpctrain.doctor.report import format_report, run
from hpctrain.site.fabric import fabric_env
from hpctrain.site.profile import ClusterProfile, load_profile
from hpctrain.train.dist import detect


def add_parser(sub) -> None:
    p = sub.add_parser(
        "doctor", help="check this node/container: versions, GPUs, InfiniBand, NCCL env", description=__doc__
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--sysfs-root", default="/sys", help="sysfs to read ports/interfaces from (default /sys)")
    p.add_argument(
        "--cluster",
        help="also check this node against a cluster profile: what its jobs export (NCCL_IB_HCA, "
        "NCCL_SOCKET_IFNAME, …; the environment wins over the profile), its container runtime, "
        "image, modules, GPUs per node and fabric",
    )
    p.add_argument(
        "--cluster-set",
        dest="cluster_overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a profile key (repeatable), e.g. fabric.hcas=[mlx5_0,mlx5_3]",
    )
    p.add_argument(
        "--allreduce",
        action="store_true",
        help="measure all-reduce bus bandwidth over the job's ranks (torchrun/srun) or --procs local ones",
    )
    p.add_argument("--procs", type=int, default=2, help="local ranks to spawn outside a job (default 2)")
    p.add_argument("--sizes", default="64K,1M,16M,256M", help="message sizes (default 64K,1M,16M,256M)")
    p.add_argument("--iters", type=int, default=10, help="timed all-reduces per size (default 10)")
    p.add_argument("--backend", choices=["nccl", "gloo"], help="default: nccl with GPUs, else gloo")
    p.set_defaults(func=doctor)


def profile_env(profile: ClusterProfile) -> dict[str, str]:
    """The environment a task of this profile's jobs sees: the batch script exports the profile's
    fabric values unless the job's environment has them (`export K=${K-v}`)."""
    return {**fabric_env(profile), **os.environ}


def doctor(args: argparse.Namespace) -> int:

    env, profile = None, None
    if args.cluster or args.cluster_overrides:
        profile = load_profile(args.cluster or os.environ.get("HPCTRAIN_CLUSTER"), args.cluster_overrides)
        env = profile_env(profile)
    report = run(args.sysfs_root, env=env, profile=profile)
    is_main = True
    if args.allreduce:
        try:
            sizes = [allreduce.parse_size(s) for s in args.sizes.split(",") if s.strip()]
        except ValueError as e:
            raise CLIError(str(e)) from None
        if args.iters < 1 or args.procs < 1:
            raise CLIError("--iters and --procs must be at least 1")
        info = detect()
        if info.world_size > 1:
            report.allreduce = allreduce.run_in_job(sizes, args.iters, backend=args.backend)
            is_main = info.is_main
        elif args.procs > 1:
            report.allreduce = allreduce.run_local(args.procs, sizes, args.iters, backend=args.backend)
        else:
            raise CLIError("--allreduce needs several ranks: run under torchrun/srun, or pass --procs 2")
    if not is_main:
        return 0
    print(json.dumps(report.to_dict(), indent=2) if args.json else format_report(report))
    return 0 if report.ok else 1

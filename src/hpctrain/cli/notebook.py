"""`hpctrain notebook`: Jupyter inside the image on a compute node, and the SSH tunnel to it."""

from __future__ import annotations

import argparse
import os
import shlex
import socket

from hpctrain.launch import dryrun
from hpctrain.launch import notebook as nb
from hpctrain.launch.prepare import Notebook, prepare
from hpctrain.launch.submit import Request
from hpctrain.site.profile import load_profile
from hpctrain.site.runtimes import CHOICES


def add_parser(sub) -> None:
    p = sub.add_parser("notebook", help="submit a Jupyter job and print the SSH tunnel command", description=__doc__)
    p.add_argument(
        "--cluster",
        default=None,
        help="cluster profile for partition, account, qos, constraint, modules and image (default $HPCTRAIN_CLUSTER)",
    )
    p.add_argument("--nodes", type=int, default=1, help="nodes to allocate (default 1)")
    p.add_argument("--gpus-per-node", type=int, default=1, help="GPUs per node (default 1; 0: none)")
    p.add_argument("--cpus", type=int, default=8, help="CPUs for the notebook (default 8)")
    p.add_argument("--mem", default="", help="memory, e.g. 64G (default: the partition's)")
    p.add_argument("--time", default="04:00:00", help="time limit (default 04:00:00)")
    p.add_argument("--partition", default="", help="Slurm partition")
    p.add_argument("--account", default="", help="Slurm account")
    p.add_argument("--qos", default="", help="Slurm QOS (default: the profile's)")
    p.add_argument("--constraint", default="", help="node features, e.g. a100 (default: the profile's)")
    p.add_argument(
        "--image",
        default="",
        help="image to run Jupyter in: a SIF, or for pyxis a squashfs or registry URI "
        "(default: the profile's; without one, the host's python3)",
    )
    p.add_argument(
        "--runtime",
        default=None,
        choices=CHOICES,
        help="what starts the image (default: the profile's container.runtime, else apptainer)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help="Jupyter port on the node (default: drawn at random per job from 30000-32767)",
    )
    p.add_argument(
        "--setup",
        action="append",
        default=[],
        metavar="LINE",
        help="shell line to run first, e.g. 'module load apptainer' (repeatable)",
    )
    p.add_argument("--login-host", default=None, help="login host for the tunnel (default: this host's name)")
    p.add_argument("--wait", type=float, default=120, help="seconds to wait for the job to start (default 120)")
    dryrun.add_arg(
        p,
        help="submit nothing: print the batch script (short: --dry-run and --dry-run=full print it whole) "
        "and the tunnel command",
    )
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    name = args.cluster or os.environ.get("HPCTRAIN_CLUSTER")
    req = Request(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        time=args.time,
        partition=args.partition,
        account=args.account,
        qos=args.qos,
        constraint=args.constraint,
    )
    kind = Notebook(
        cpus=args.cpus, mem=args.mem, image=args.image, runtime=args.runtime, port=args.port, setup=tuple(args.setup)
    )
    job = prepare(None, load_profile(name) if name else None, req, kind, dry_run=bool(args.dry_run)).plan
    login = args.login_host or socket.getfqdn()
    if args.dry_run:
        print(nb.batch_script(job), end="")
        print(f"# on your laptop, once the job runs on <node>:\n{nb.tunnel_command(job, login=login)}")
        print(f"# the token (the job writes it, mode 0600; never in the log): cat {shlex.quote(nb.token_file(job))}")
        print(f"# {nb.tensorboard_hint(job)}")
        return 0
    job_id = nb.submit(job)
    log = shlex.quote(os.path.join(job.workdir, f"notebook-{job_id}.log"))  # pasteable as one word
    print(f"submitted notebook job {job_id}; log: {log}")
    node = nb.wait_for_node(job_id, args.wait)
    if node is None:
        print(f"not started after {args.wait:g} s; when it runs (squeue -j {job_id}), tunnel with:")
        print(nb.tunnel_command(job, login=login))
    else:
        print(f"running on {node}; on your laptop run:\n  {nb.tunnel_command(job, node, login)}")
    token = shlex.quote(nb.token_file(job, job_id))
    print(f"then open http://localhost:{job.port}/lab with the token from: cat {token}")
    print(nb.tensorboard_hint(job))
    return 0

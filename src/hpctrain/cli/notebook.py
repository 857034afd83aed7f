"""`hpctrain notebook`: Jupyter inside the image on a compute node, and the SSH tunnel to it."""

from __future__ import annotations

import argparse
import os
import shlex
import socket

from hpctrain import notebook as nb
from hpctrain.launch.container import RUNTIMES
from hpctrain.site.modules import module_lines
from hpctrain.site.profile import load_profile


def add_parser(sub) -> None:
    p = sub.add_parser(
        "notebook", help="submit a Jupyter job and print the SSH tunnel command", description=__doc__
    )
    p.add_argument("--cluster", default=None,
                   help="cluster profile for partition, account, qos, constraint, modules and image "
                        "(default $HPCTRAIN_CLUSTER)")
    p.add_argument("--nodes", type=int, default=1, help="nodes to allocate (default 1)")
    p.add_argument("--gpus-per-node", type=int, default=1, help="GPUs per node (default 1; 0: none)")
    p.add_argument("--cpus", type=int, default=8, help="CPUs for the notebook (default 8)")
    p.add_argument("--mem", default="", help="memory, e.g. 64G (default: the partition's)")
    p.add_argument("--time", default="04:00:00", help="time limit (default 04:00:00)")
    p.add_argument("--partition", default="", help="Slurm partition")
    p.add_argument("--account", default="", help="Slurm account")
    p.add_argument("--qos", default="", help="Slurm QOS (default: the profile's)")
    p.add_argument("--constraint", default="", help="node features, e.g. a100 (default: the profile's)")
    p.add_argument("--image", default="",
                   help="image to run Jupyter in: a SIF, or for pyxis a squashfs or registry URI "
                        "(default: the profile's; without one, the host's python3)")
    p.add_argument("--runtime", default=None, choices=RUNTIMES,
                   help="what starts the image (default: the profile's container.runtime, else apptainer)")
    p.add_argument(
        "--port", type=int, default=None,
        help="Jupyter port on the node (default: drawn at random per job from 30000-32767)"
    )
    p.add_argument(
        "--setup",
        action="append",
        default=[],
        metavar="LINE",
        help="shell line to run first, e.g. 'module load apptainer' (repeatable)",
    )
    p.add_argument("--login-host", default=None, help="login host for the tunnel (default: this host's name)")
    p.add_argument(
        "--wait", type=float, default=120, help="seconds to wait for the job to start (default 120)"
    )
    p.add_argument("--dry-run", action="store_true", help="print the batch script and tunnel command only")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:

    name = args.cluster or os.environ.get("HPCTRAIN_CLUSTER")
    prof = load_profile(name) if name else None
    image = args.image
    runtime = args.runtime or (prof.container.runtime if prof else "apptainer")
    setup = list(args.setup)
    if prof:  # the site's defaults; the flags win
        if not image and runtime == prof.container.runtime != "none":
            image = prof.container.image
        in_image = bool(image)  # Jupyter in the image: load what starts it, not cuda/nccl (see launch.modules)
        mods, var = (prof.container_modules, "HPCTRAIN_CONTAINER_MODULES") if in_image else (prof.modules,
                                                                                              "HPCTRAIN_MODULES")
        setup = module_lines(mods, prof.module_use, var, prof.module_purge) + setup
    kw = dict(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        cpus=args.cpus,
        mem=args.mem,
        time=args.time,
        partition=args.partition or (prof.slurm.partition if prof else ""),
        account=args.account or (prof.slurm.account if prof else ""),
        qos=args.qos or (prof.slurm.qos if prof else ""),
        constraint=args.constraint or (prof.slurm.constraint if prof else ""),
        image=image,
        runtime=runtime,
        setup=tuple(setup),
    )
    if args.port is not None:
        kw["port"] = args.port
    job = nb.NotebookJob(**kw)
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

"""`hpctrain cluster init NAME`: write a cluster profile from what Slurm, slurmdbd and Lmod say.

Reads partitions, time limits, GPUs (GRES), CPUs and memory of the nodes (scontrol), your accounts
and QOS and the QOS's limits (sacctmgr), the apptainer/singularity/cuda/nccl modules (Lmod), the
container runtime installed (apptainer, SingularityCE, pyxis); with --probe, runs
`hpctrain doctor --json` on one node of the partition (srun, under the chosen account and QOS, inside
--image when given) for the fabric. Writes
$XDG_CONFIG_HOME/hpctrain/clusters/NAME.yaml (default ~/.config/…; `--cluster NAME` finds it) or
-o PATH, each value commented with its source; prints the choices to review. Imports no torch.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

from hpctrain.cli import CLIError
from hpctrain.site import cluster_init as ci
from hpctrain.site.profile import load_profile, user_cluster_dir


def add_parser(sub) -> None:
    p = sub.add_parser(
        "cluster",
        help="cluster profiles: `cluster init NAME` writes one from Slurm's own tools",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    csub = p.add_subparsers(dest="cluster_command", metavar="SUBCOMMAND", required=True)
    q = csub.add_parser(
        "init",
        help="write a profile for this cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    q.add_argument("name", help="profile name (a plain file name: letters, digits, . _ -)")
    q.add_argument("-o", "--output", help="write here instead of $XDG_CONFIG_HOME/hpctrain/clusters/NAME.yaml")
    q.add_argument(
        "--partition",
        help="the partition jobs go to (default: the default one if it has GPUs, else the first with GPUs)",
    )
    q.add_argument(
        "--image",
        help="image the tasks run in: a .sif (Apptainer/SingularityCE, whichever is installed) "
        "or an enroot .sqsh/URI (pyxis); default: the host's Python",
    )
    q.add_argument(
        "--probe",
        action="store_true",
        help="run `hpctrain doctor --json` on one node of the partition (srun, with the account and QOS "
        "chosen; inside --image when given) for the fabric",
    )
    q.add_argument("--force", action="store_true", help="overwrite an existing profile")
    q.set_defaults(func=init)


def init(args: argparse.Namespace) -> int:

    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", args.name):
        raise CLIError(f"cluster name {args.name!r}: use letters, digits, '.', '_' and '-' (e.g. mysite)")
    out = Path(args.output) if args.output else user_cluster_dir() / f"{args.name}.yaml"
    if out.exists() and not args.force:
        raise CLIError(f"{out} exists: pass --force to overwrite it, or -o another path")
    facts = ci.gather()
    part = ci.choose_partition(facts.partitions, args.partition)
    account, qos = ci.account_and_qos(facts)
    runtime = ci.rt.choose(facts.runtimes, args.image or "")[0]
    fabric = (
        ci.fabric_from_doctor(ci.probe(part, account=account, qos=qos, image=args.image or "", runtime=runtime))
        if args.probe
        else None
    )
    text, notes = ci.render(args.name, facts, part, fabric, args.image or "")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    load_profile(tmp)  # what we write must load (a bug otherwise)
    tmp.replace(out)
    print(f"wrote {shlex.quote(str(out))}")
    for n in notes:
        print(f"  review: {n}")
    print(
        f"try it: hpctrain submit --cluster {args.name if not args.output else shlex.quote(str(out))} "
        "--config configs/digits_vit.yaml --dry-run"
    )
    return 0

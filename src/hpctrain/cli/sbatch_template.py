"""`hpctrain sbatch-template [PATH]`: write the shipped stand-alone batch script (`slurm/vit.sbatch` of
the checkout: 16 nodes x 8 GPUs, the large-batch recipe, the example-ib profile) to PATH, to submit with
`sbatch` and adapt through its environment variables. For a script made from your own config and
cluster profile: `hpctrain submit --config … --cluster … --emit-sbatch PATH`."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from hpctrain.cli import CLIError
from hpctrain.shipped import SBATCH_TEMPLATE


def add_parser(sub) -> None:
    p = sub.add_parser(
        "sbatch-template", help="write the shipped stand-alone batch script (vit.sbatch) to a path", description=__doc__
    )
    p.add_argument("path", nargs="?", default="vit.sbatch", help="file to write (default ./vit.sbatch; - prints it)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    text = SBATCH_TEMPLATE.read_text()
    if args.path == "-":
        sys.stdout.write(text)
        return 0
    out = Path(args.path)
    if out.is_dir():
        out = out / SBATCH_TEMPLATE.name
    if out.exists() and not args.force:
        raise CLIError(f"{out} already exists: pass --force to overwrite it, or give another path")
    if not out.parent.is_dir():
        raise CLIError(f"{out.parent} is not a directory: create it first, or give another path")
    out.write_text(text)
    print(
        f"wrote {shlex.quote(str(out))}: submit it with `sbatch {shlex.quote(str(out))}` "
        "(its header lists the variables that adapt it)"
    )
    return 0

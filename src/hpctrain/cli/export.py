"""`hpctrain export`: a run's checkpoint (single file or sharded) as one timm-compatible state_dict."""

from __future__ import annotations

import argparse
from pathlib import Path

from hpctrain.cli import CLIError


def add_parser(sub) -> None:
    p = sub.add_parser(
        "export", help="write a checkpoint's weights as one .safetensors or .pt state_dict", description=__doc__
    )
    p.add_argument("run", help="run directory (its newest checkpoint) or a checkpoint (step-<n>.pt or step-<n>/)")
    p.add_argument("--step", type=int, help="export this step's checkpoint instead of the newest")
    p.add_argument("-o", "--output", required=True, help="output file: *.safetensors or *.pt")
    p.add_argument("--ema", action="store_true", help="the EMA weights instead of the trained ones")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if Path(args.output).exists() and not args.force:  # as sbatch-template: weights are never lost unasked
        raise CLIError(f"{args.output} already exists: pass --force to overwrite it, or give another path")
    from hpctrain.train.ckpt.export import export  # torch: not on a login node until this command runs

    path, out = export(args.run, args.output, args.step, args.ema)
    print(f"exported {'EMA weights' if args.ema else 'weights'} of {path} to {out}")
    return 0

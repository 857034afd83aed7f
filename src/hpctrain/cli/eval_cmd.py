"""`hpctrain eval`: exact top-1/top-5 and loss of a run's (or a file's) weights, per-class accuracy
and the most confused pairs; one process, or every task of `torchrun` / `srun`."""

from __future__ import annotations

import argparse
from pathlib import Path

from hpctrain.cli import CLIError


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a run's or a file's weights on a split (exact for any world size)",
                       description=__doc__)
    p.add_argument("run", nargs="?", help="run directory (its newest checkpoint and its config.yaml) or a "
                                          "checkpoint in one (step-<n>.pt or step-<n>/)")
    p.add_argument("--weights", help="a weights file instead of RUN (.safetensors/.pt/.pth state_dict, an "
                                     "hpctrain checkpoint); needs --config")
    p.add_argument("--config", "-c", help="config of the model and data (default with RUN: the run's config.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (repeatable)")
    p.add_argument("--data", help="dataset root (data.root)")
    p.add_argument("--split", choices=("val", "minival"), help="root/val, or the 1 %% of root/train held out as "
                                                               "minival (data.val_split); default: the config's")
    p.add_argument("--ema", action="store_true", help="the checkpoint's EMA weights")
    p.add_argument("--img-size", type=int, help="evaluate at this resolution (position embedding resampled)")
    p.add_argument("--crop-pct", type=float, help="val resize to img_size / crop_pct, then centre crop")
    p.add_argument("-o", "--output", help="folder for summary.json and per_class.csv (default RUN/eval, or "
                                          "./eval with --weights); rank 0 writes it")
    p.set_defaults(func=main)


def resolve(args: argparse.Namespace):
    """(config, weights source, output folder) from the command line; no torch imported."""
    from hpctrain.cli.common import load_config

    if bool(args.run) == bool(args.weights):
        raise CLIError("give a run directory (hpctrain eval RUN) or a weights file with its config "
                       "(hpctrain eval --weights FILE --config C), not both or neither")
    sets = list(args.overrides)
    sets += [f"data.root={args.data}"] if args.data else []
    sets += [f"data.val_split={args.split}"] if args.split else []
    sets += [f"model.img_size={args.img_size}"] if args.img_size else []
    sets += [f"data.crop_pct={args.crop_pct}"] if args.crop_pct else []
    sets += ["model.init_from="]  # evaluation loads the weights given here, never the config's start
    if args.run:
        run = Path(args.run)
        run_dir = run.parent.parent if run.parent.name == "checkpoints" else run
        config = args.config or run_dir / "config.yaml"
        if not Path(config).is_file():
            raise CLIError(f"{run_dir} has no config.yaml: is it a run directory? Otherwise give --config")
        out = Path(args.output) if args.output else run_dir / "eval"
        return load_config(str(config), sets), str(run), out
    if not args.config:
        raise CLIError("--weights needs --config (the model and data the weights go with)")
    return load_config(args.config, sets), args.weights, Path(args.output or "eval")


def main(args: argparse.Namespace) -> int:
    cfg, weights, out = resolve(args)
    from hpctrain.data.prepare import ensure_dataset
    from hpctrain.train import dist as distmod
    from hpctrain.train.evaluate import run, summary_text

    ensure_dataset(cfg)
    summary = run(cfg, weights, args.ema, out)
    if distmod.detect().is_main:
        print(summary_text(summary))
    return 0

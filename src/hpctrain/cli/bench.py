"""`hpctrain bench`: images/s, step time, FLOPs per image, MFU, data wait and peak memory."""

from __future__ import annotations

import argparse
import json
import sys

from hpctrain.bench import measure, report
from hpctrain.cli import CLIError, Parser, add_config_args
from hpctrain.cli.common import load_config
from hpctrain.config import ConfigError
from hpctrain.train.dist import detect


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="measure the training step: images/s, MFU, data wait, memory", description=__doc__)
    add_config_args(p)
    p.add_argument("--steps", type=int, default=20, help="timed optimizer steps (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first: compilation, autotuning (default 3)")
    p.add_argument(
        "--loader",
        action="store_true",
        help="read the configured data loader instead of synthetic batches on the device",
    )
    p.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="the device's dense-bf16 spec peak in TFLOP/s, MFU's denominator (default: "
        "the table of known GPUs, e.g. 989 for H100/H200 SXM)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object with every field")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.steps < 1 or args.warmup < 0:
        raise CLIError("--steps must be >= 1 and --warmup >= 0")
    if args.peak_tflops is not None and args.peak_tflops <= 0:
        raise CLIError("--peak-tflops must be a positive number of TFLOP/s, e.g. --peak-tflops 989")
    cfg = load_config(args.config, args.overrides)
    result = measure(
        cfg,
        steps=args.steps,
        warmup=args.warmup,
        use_loader=args.loader,
        peak_tflops=args.peak_tflops,
        config_name=args.config or "default",
    )

    if detect().is_main:
        print(json.dumps(result) if args.json else report(result), flush=True)
    return 0


def standalone(argv: list[str] | None = None) -> int:
    """`python -m hpctrain.cli.bench …`: this command alone, without importing the other commands
    (for GPU machines that have torch but not the launch dependencies)."""
    parser = Parser(prog="hpctrain")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    try:
        return main(args)
    except (CLIError, ConfigError) as e:
        print(f"hpctrain: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(standalone())

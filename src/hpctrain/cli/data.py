"""`hpctrain data …`: make, check and pack datasets."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("data", help="datasets: digits demo set, ImageNet preparation, shards",
                       description=__doc__)
    dsub = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    d = dsub.add_parser("digits", help="write scikit-learn's 8×8 digits as an ImageNet-layout folder")
    d.add_argument("out", help="output folder (gets train/ and val/)")
    d.add_argument("--size", type=int, default=32, help="image side in pixels (default 32)")
    d.set_defaults(func=digits)


def digits(args: argparse.Namespace) -> int:
    from hpctrain.data.digits import write_digits

    counts = write_digits(args.out, args.size)
    print(f"wrote {counts['train']} train and {counts['val']} val images to {args.out}")
    return 0

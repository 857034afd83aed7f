"""`hpctrain config`: show the resolved config, or every key with its default and doc."""

from __future__ import annotations

import argparse

from hpctrain.cli import add_config_args


def add_parser(sub) -> None:
    p = sub.add_parser("config", help="print the resolved config (or --keys: every key)",
                       description=__doc__)
    add_config_args(p)
    p.add_argument("--keys", action="store_true", help="list every key, its default and what it does")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    import yaml

    from hpctrain import config
    from hpctrain.cli.common import load_config

    if args.keys:
        for key, default, doc in config.describe():
            print(f"{key:28s} {default:22s} {doc}")
        return 0
    cfg = load_config(args.config, args.overrides)
    print(yaml.safe_dump(config.to_dict(cfg), sort_keys=False), end="")
    return 0

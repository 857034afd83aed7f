"""`hpctrain config`: show the resolved config, every key with its default and doc, or the shipped
configs and cluster profiles (`list`; `show NAME` prints one as written, comments included, to
redirect into a file and edit)."""

from __future__ import annotations

import argparse
import sys

import yaml

from hpctrain import config, shipped
from hpctrain.cli import CLIError, add_config_args
from hpctrain.cli.common import load_config


def add_parser(sub) -> None:
    p = sub.add_parser(
        "config",
        help="print the resolved config (--keys: every key; list / show NAME: shipped ones)",
        description=__doc__,
    )
    p.add_argument(
        "action",
        nargs="?",
        choices=("list", "show"),
        help="list: the shipped configs and cluster profiles; show NAME: print one as written",
    )
    p.add_argument("name", nargs="?", help="for show: a shipped config or cluster profile name")
    add_config_args(p)
    p.add_argument("--keys", action="store_true", help="list every key, its default and what it does")
    p.set_defaults(func=main)


def list_shipped() -> None:
    print("configs (--config NAME; `hpctrain config show NAME > my.yaml` to copy and edit one):")
    for p in shipped.configs():
        print(f"  {p.stem:28s} {shipped.summary(p)}")
    print("cluster profiles (--cluster NAME):")
    for p in shipped.profiles():
        print(f"  {p.stem:28s} {shipped.summary(p)}")


def show_shipped(name: str) -> None:
    path = shipped.lookup(name, shipped.CONFIG_DIR, (".yaml",)) or shipped.lookup(name, shipped.CLUSTER_DIR, (".yaml",))
    if path is None:
        raise CLIError(
            f"{name!r} is not a shipped config or cluster profile: configs "
            f"{shipped.names(shipped.configs())}; cluster profiles {shipped.names(shipped.profiles())}"
        )
    sys.stdout.write(path.read_text())


def main(args: argparse.Namespace) -> int:

    if args.action == "list":
        if args.name:
            raise CLIError(f"config list takes no name (got {args.name!r}); `hpctrain config show NAME` prints one")
        list_shipped()
        return 0
    if args.action == "show":
        if not args.name:
            raise CLIError("config show needs a NAME: one of `hpctrain config list`")
        show_shipped(args.name)
        return 0
    if args.keys:
        for key, default, doc in config.describe():
            print(f"{key:28s} {default:22s} {doc}")
        return 0
    cfg = load_config(args.config, args.overrides)
    print(yaml.safe_dump(config.to_dict(cfg), sort_keys=False), end="")
    return 0

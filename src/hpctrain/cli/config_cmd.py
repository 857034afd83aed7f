"""`hpctrain config`: show the resolved config, every key with its default and doc, or the shipped
configs and cluster profiles (`list`; `show NAME` prints one as written, comments included, to
redirect into a file and edit); `migrate FILE` rewrites a config file in today's key names."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from hpctrain import config, config_moves, shipped
from hpctrain.cli import CLIError, add_config_args
from hpctrain.cli.common import load_config
from hpctrain.run.layout import atomic_write


def add_parser(sub) -> None:
    p = sub.add_parser(
        "config",
        help="print the resolved config (--keys: every key; list / show NAME: shipped ones)",
        description=__doc__,
    )
    p.add_argument(
        "action",
        nargs="?",
        choices=("list", "show", "migrate"),
        help="list: the shipped configs and cluster profiles; show NAME: print one as written; "
        "migrate FILE: rewrite a config file in today's key names, comments kept (FILE.bak: the old text)",
    )
    p.add_argument("name", nargs="?", help="for show: a shipped config or cluster profile name; for migrate: a file")
    p.add_argument("-o", "--output", help="for migrate: write the new text here instead of over FILE")
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


def unrenamed(old: dict, want: dict, moved: list[config_moves.Move]) -> str:
    """Why the text could not be rewritten, naming the keys and what to write instead. The rewrite
    reads block layout (`section:`, then its keys indented): a key in flow style (`data: {reprob: 0.1}`)
    is not seen in the text; a block list beside a key whose value changes form is not rewritten."""
    done = {m.old for m in moved}
    left = [m for m in config_moves.present(old) if m.old not in done]
    why = "written in flow style, `section: {key: value}`, which migrate does not rewrite"
    if not left:
        left = [m for m in moved if m.rule] or moved
        why = "the rewritten text would not read as the file does: a block list beside a key whose value changes form?"
    fixes = []
    for m in left:
        gone = config_moves.removed(m, old)
        section, name = m.new.split(".") if m.new else ("", "")
        value = config_moves.flow((want.get(section) or {}).get(name))
        fixes.append(f"drop {m.old} ({gone})" if gone else f"replace {m.old} with `{section}: {{{name}: {value}}}`")
    return f"cannot rename {', '.join(m.old for m in left)} in place ({why}): edit it by hand: {'; '.join(fixes)}"


UNREADABLE = object()  # what a rewritten text YAML cannot read is read as: equal to no config


def reads(text: str) -> object:
    """The rewritten text as YAML reads it."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return UNREADABLE


def migrate(name: str | None, output: str | None) -> None:
    """Rename the moved keys of a config file where they stand; the result must read as the old file
    does through config_moves (else nothing is written and the file is named for a hand edit)."""
    if not name:
        raise CLIError("config migrate needs a FILE: a config YAML to rewrite in today's key names")
    path = Path(name)
    old = config.read_yaml(path)
    text, moved = config_moves.migrate_text(path.read_text(), config.SECTIONS)
    want, _ = config_moves.migrate_data(old, str(path))
    if reads(text) != want:
        raise CLIError(f"{path}: {unrenamed(old, want, moved)}")
    for m in moved:
        print(f"{path}: {config_moves.outcome(m, old)}")
    if not moved and not output:
        print(f"{path}: nothing to migrate: every key has today's name")
        return
    out = Path(output) if output else path
    if not output:
        atomic_write(Path(f"{path}.bak"), path.read_text())
    atomic_write(out, text)
    print(f"wrote {out}" + ("" if output else f" (the old text: {path}.bak)"))


def main(args: argparse.Namespace) -> int:
    if args.action == "migrate":
        migrate(args.name, args.output)
        return 0

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

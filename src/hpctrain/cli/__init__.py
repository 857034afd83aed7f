"""`hpctrain` command line: a thin layer over the library.

Each sub-command lives in its own module with `add_parser(subparsers)`; heavy imports (torch,
DALI) happen inside the command that needs them, so login nodes can plan and submit jobs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from hpctrain.errors import UserError
from hpctrain.version import version_line

# module name under hpctrain.cli for each command group, in --help order
COMMANDS = ["train", "submit", "sweep", "plan", "status", "cluster", "data", "config_cmd", "image",
            "sbatch_template", "doctor", "notebook", "bench", "export", "eval_cmd", "report", "sync"]


class CLIError(UserError):
    """A user-facing error: printed as one line, exit status 2."""


def add_config_args(p: argparse.ArgumentParser, default: str | None = None) -> None:
    p.add_argument("--config", "-c", default=default,
                   help="config YAML (a path, or the name of a shipped one)" +
                        (f"; default {default}" if default else ""))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set optim.lr=1e-3 (repeatable)")


class VersionAction(argparse.Action):
    """--version: the source hash is computed only when asked (it reads every source file)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpctrain", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=VersionAction,
                        help="print the version, the source hash and (from a checkout) the git commit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"hpctrain.cli.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `hpctrain config show NAME | head`: the reader left; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print("hpctrain: interrupted", file=sys.stderr)
        return 130
    except UserError as e:  # the library's errors for the user: one line, no traceback
        detail = getattr(e, "detail", None)  # a failed job's crash: the task's traceback above the line
        if detail:
            print(detail, file=sys.stderr)
        print(f"hpctrain: error: {e}", file=sys.stderr)
        return 2

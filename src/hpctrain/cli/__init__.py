"""`hpctrain` command line: a thin layer over the library.

Each sub-command lives in its own module with `add_parser(subparsers)`. The dispatcher imports
only the module of the command given (`COMMANDS`, the one table of lazy imports): `hpctrain status`
does not load the submit path, and no command loads torch or DALI unless it needs them (login
nodes have neither). Only `hpctrain --help` (or an unknown command) loads them all, to list them.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys

from hpctrain.errors import UserError
from hpctrain.version import version_line

# command word → its module under hpctrain.cli (imported only when that command is run), in --help order
COMMANDS = {
    "train": "train",
    "submit": "submit",
    "sweep": "sweep",
    "plan": "plan",
    "status": "status",
    "logs": "status",
    "goodput": "goodput",
    "cluster": "cluster",
    "data": "data",
    "config": "config_cmd",
    "image": "image",
    "sbatch-template": "sbatch_template",
    "doctor": "doctor",
    "notebook": "notebook",
    "bench": "bench",
    "export": "export",
    "eval": "eval_cmd",
    "report": "report",
    "sync": "sync",
}


class CLIError(UserError):
    """A user-facing error: printed as one line, exit status 2."""


def add_config_args(p: argparse.ArgumentParser, default: str | None = None) -> None:
    p.add_argument(
        "--config",
        "-c",
        default=default,
        help="config YAML (a path, or the name of a shipped one)" + (f"; default {default}" if default else ""),
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set optim.lr=1e-3 (repeatable)",
    )


class VersionAction(argparse.Action):
    """--version: the source hash is computed only when asked (it reads every source file)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()


class Parser(argparse.ArgumentParser):
    """An argument no parser knows is refused by the innermost (sub)command's parser, with that
    command's usage (`hpctrain data pack … --shard-szie 10`: `data pack`'s usage, not the top level's).
    argparse's subparsers parse with parse_known_args and hand what they do not know up to the top
    parser, which would print its own usage; add_subparsers makes every nested parser of this class."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        ns, extras = super().parse_known_args(args, namespace)
        if extras:
            options = [o for o in self._option_string_actions if o.startswith("--")]
            near = [m for e in extras if e.startswith("--") for m in difflib.get_close_matches(e, options, n=1)]
            hint = f" (did you mean {', '.join(near)}?)" if near else ""
            self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return ns, extras


def command_word(argv: list[str]) -> str | None:
    """The sub-command named on the command line (the top level has only options without values)."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for `argv`'s command alone when it names one, else for every command."""
    parser = Parser(prog="hpctrain", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--version",
        action=VersionAction,
        help="print the version, the source hash and (from a checkout) the git commit",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    word = command_word(sys.argv[1:] if argv is None else argv)
    modules = [COMMANDS[word]] if word in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for name in modules:
        importlib.import_module(f"hpctrain.cli.{name}").add_parser(sub)
    return parser


# A package a command imports when it runs → the extra that installs it (pyproject.toml): the base
# install (a login node's) answers a command that needs more in one line, not with a traceback.
EXTRA_OF = {
    "torch": "train",
    "numpy": "train",
    "PIL": "train",
    "nvidia": "dali",  # nvidia.dali
    "safetensors": "train",
    "tensorboard": "train",
    "pynvml": "train",
    "scipy": "data",  # data pack --from ilsvrc2012 (meta.mat)
    "pyarrow": "data",  # data pack --from hf-parquet
    "matplotlib": "report",
    "mlflow": "trackers",
    "wandb": "trackers",
}


def missing_extra(e: ModuleNotFoundError, command: str | None) -> str | None:
    """The one line for a command that needs a package of an extra this install lacks (None: not one)."""
    top = (e.name or "").split(".")[0]
    if top not in EXTRA_OF:
        return None
    return f"`hpctrain {command or ''}` needs {top}, which this install lacks: pip install 'hpctrain[{EXTRA_OF[top]}]'"


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser(argv).parse_args(argv)
        return int(args.func(args) or 0)
    except ModuleNotFoundError as e:
        why = missing_extra(e, command_word(sys.argv[1:] if argv is None else argv))
        if why is None:
            raise
        print(f"hpctrain: error: {why}", file=sys.stderr)
        return 2
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

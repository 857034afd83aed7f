"""cli/__init__.py: the dispatcher imports the module of the command given, and no other."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from hpctrain.cli import COMMANDS, build_parser, main

PROBE = r"""
import json, sys
from hpctrain.cli import build_parser
build_parser(sys.argv[1:])
print(json.dumps(sorted(m for m in sys.modules if m.startswith("hpctrain."))))
"""


def loaded(*argv: str) -> list[str]:
    r = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_command_loads_its_own_module_only():
    mods = loaded("status", "runs/x")
    cli = [m for m in mods if m.startswith("hpctrain.cli.")]
    assert cli == ["hpctrain.cli.status"]
    logs = loaded("logs", "-f", "x")
    assert [m for m in logs if m.startswith("hpctrain.cli.")] == ["hpctrain.cli.status"]


@pytest.mark.slow
def test_help_and_an_unknown_command_list_every_command_of_the_table():
    mods = loaded()
    assert {f"hpctrain.cli.{m}" for m in COMMANDS.values()} <= set(mods)
    sub = next(a for a in build_parser([])._actions if a.dest == "command")
    assert list(sub.choices) == list(COMMANDS)  # each module registers exactly its table's words, in order
    r = subprocess.run([sys.executable, "-m", "hpctrain", "sumbit"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "invalid choice: 'sumbit'" in r.stderr and "submit" in r.stderr


def commands(parser, words: tuple[str, ...] = ()):
    """Every (sub)command of `parser` that runs (a leaf: no subcommand of its own), as the words that
    name it and values for the positional arguments it needs, e.g. ("data", "pack", "x", "x")."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        required = [(a.option_strings[0],) for a in parser._actions if a.option_strings and a.required]
        needed = [a for a in parser._actions if not a.option_strings and a.nargs not in ("?", "*")]
        values = [*(v for o in required for v in (*o, "x")), *(str(a.choices[0]) if a.choices else "x" for a in needed)]
        yield words, tuple(values)
    for action in subs:
        for name, p in action.choices.items():
            yield from commands(p, (*words, name))


def test_an_unknown_option_of_any_subcommand_shows_that_subcommands_usage(capsys):
    """Issue 56: `data pack … --shard-szie 10` printed the top level's usage (argparse's subparsers hand
    the arguments they do not know up to the top parser); each subcommand at every depth shows its own."""
    leaves = list(commands(build_parser([])))
    names = {words for words, _ in leaves}
    assert {("data", "pack"), ("image", "convert"), ("cluster", "init"), ("config",), ("submit",)} <= names
    for words, values in leaves:
        with pytest.raises(SystemExit) as e:
            main([*words, *values, "--no-such-option=1"])
        err = capsys.readouterr().err
        assert e.value.code == 2, words
        prog = " ".join(("hpctrain", *words))
        assert err.startswith(f"usage: {prog} "), err
        assert f"{prog}: error: unrecognized arguments: --no-such-option=1" in err, err
    with pytest.raises(SystemExit):
        main(["data", "pack", "in", "out", "--shard-szie", "10"])
    err = capsys.readouterr().err
    assert err.startswith("usage: hpctrain data pack ") and err.endswith(
        "hpctrain data pack: error: unrecognized arguments: --shard-szie 10 (did you mean --shard-size?)\n"
    ), err

"""cli/__init__.py: the dispatcher imports the module of the command given, and no other."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpctrain.cli import COMMANDS, build_parser

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

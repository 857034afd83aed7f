"""The batch shell's code: bash files under launch/shell/, shipped as package data and inlined by the
renderers (launch/sbatch.py, inplace.py, container.py, stage_image.py) after a header of values.

Bash, not Python strings, so that `bash -n` and shellcheck read it (tests/launch/test_shell_files.py).
A file's leading `# shellcheck` lines are for the file checked alone (its dialect, and the variables
the other parts set), and its `# summary:` line says in one line what it does (the short dry run lists
it, launch/dryrun.py): neither is inlined. Values reach the script only through `assign` (refused with
a control character, shell-quoted) and `default`. `recording` names the files a renderer inlined.

A file is named by its name in launch/shell/ (a str), or by its path (a Path): a container runtime
that is not one of hpctrain's own keeps its branch beside its module (site/runtimes/base.py).
A base module, below launch/ and site/, so that both write bash with it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from importlib import resources
from pathlib import Path

from hpctrain.config import control_char

DIRECTIVE = "# shellcheck "
SUMMARY = "# summary: "
_INLINED: ContextVar[list[Shell] | None] = ContextVar("hpctrain_shell_inlined", default=None)
VAR_RE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
GLOB_WORD = re.compile(r"[\w@%+=:,./*-]+", re.ASCII)  # nothing in it is special inside double quotes


Shell = str | Path  # a file of launch/shell/ by name, or any file by its path


@cache
def text(name: Shell) -> str:
    """A file of launch/shell/ as shipped, or the file at a path."""
    if isinstance(name, Path):
        return name.read_text()
    return resources.files("hpctrain.launch").joinpath("shell", name).read_text()


def label(name: Shell) -> str:
    """How the dry run names the file: its name."""
    return name.name if isinstance(name, Path) else name


def lines(name: Shell, indent: str = "") -> list[str]:
    """The file's lines to inline, without its leading shellcheck directives and summary; `indent` for a block."""
    inlined = _INLINED.get()
    if inlined is not None and name not in inlined:
        inlined.append(name)
    out = text(name).splitlines()
    while out and out[0].startswith((DIRECTIVE, SUMMARY)):
        out.pop(0)
    return [f"{indent}{line}" if line else line for line in out]


SETUP = re.compile(r"^(hpctrain_setup_\w+)\(\) \{")


def setup_calls(lines: Sequence[str]) -> list[str]:
    """A call of each part's setup function (`hpctrain_setup_<file>`: what the part does before the
    steps, where its code once ran at the top level) that `lines` define, in their order: a script's
    main runs them after every definition."""
    return [m.group(1) for ln in lines if (m := SETUP.match(ln))]


def summary(name: Shell) -> str:
    """The file's one-line `# summary:` (every file has one: tests/launch/test_dryrun.py)."""
    for line in text(name).splitlines():
        if line.startswith(SUMMARY):
            return line[len(SUMMARY) :].strip()
        if not line.startswith(DIRECTIVE):
            break
    where = name if isinstance(name, Path) else f"launch/shell/{name}"
    raise ValueError(f"{where} has no '{SUMMARY.strip()}' line under its shellcheck directives")


@contextmanager
def recording() -> Iterator[list[Shell]]:
    """The names of the files `lines` inlines inside the block, in order, each once: what a rendered
    script is made of, for the short dry run."""
    names: list[Shell] = []
    token = _INLINED.set(names)
    try:
        yield names
    finally:
        _INLINED.reset(token)


def program(names: Sequence[Shell], values: Sequence[str] = ()) -> str:
    """A bash program run by `bash -c` (per task, per node): the value lines, the files, then the
    files' setup functions (`setup_calls`)."""
    body = [line for n in names for line in lines(n)]
    return "\n".join([*values, *body, *setup_calls(body)]) + "\n"


def word(value: object) -> str:
    """One shell word holding `value` exactly; a control character is a bug upstream (config.check_text)."""
    s = str(value)
    if control_char(s):
        raise ValueError(f"shell value {s!r} contains a control character")
    if GLOB_WORD.fullmatch(s) and "*" in s:
        return f'"{s}"'  # a pattern such as NAME_*: double quotes read better inside a quoted program
    q = shlex.quote(s)
    return f"'{s}'" if q == s and "," in s else q  # quoted, so that no one reads a,b as a list (SC2054)


def node_word(text: str) -> tuple[str, list[str]]:
    """A path as one bash word expanded where the script runs ($NAME, ${NAME}, a leading ~), and the
    variables it needs: data.stage_to and container.stage_image_to, which each node expands with its
    own variables (the task expands data.stage_to there too, data/stage.py, so the bind must match)."""
    parts, names, pos = [], [], 0
    text = "$HOME" + text[1:] if text.startswith("~") else text
    for m in VAR_RE.finditer(text):
        if m.start() > pos:
            parts.append(shlex.quote(text[pos : m.start()]))
        name = m.group(1) or m.group(2)
        parts.append(f'"${{{name}}}"')
        names.append(name)
        pos = m.end()
    if pos < len(text):
        parts.append(shlex.quote(text[pos:]))
    return "".join(parts), names


def assign(name: str, value: object) -> str:
    """`name=value`, the value one quoted word."""
    return f"{name}={word(value)}"


def default(name: str, value: object, env: str | None = None, if_empty: bool = False) -> str:
    """`name=${name-value}`: `value` unless the job's environment sets `name` (empty too: it turns a
    default off), for the settings a user may override per job (HPCTRAIN_MODULES, HPCTRAIN_CONFIG...);
    `env` names another variable to read (the shell's own name for a user's HPCTRAIN_* setting), and
    `if_empty` takes `value` for an empty one too (`${env:-value}`)."""
    return default_word(name, word(value), env, if_empty)


def function(name: str, body: Sequence[str]) -> list[str]:
    """`name() { body }`: the body's lines indented under the header (a multi-line value in them keeps
    its own lines as they are). `name` is a bash identifier (ValueError otherwise)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"{name!r} is not a bash function name")
    return [f"{name}() {{", *(f"  {ln}" if ln else ln for ln in body), "}"]


def default_word(name: str, shell_word: str, env: str | None = None, if_empty: bool = False) -> str:
    """`name=${env-WORD}` (`env` is `name` unless given; `${env:-WORD}` with `if_empty`) with WORD a
    shell word as given (quoted already, or a command substitution: the stand-alone script's code
    snapshot is found where it runs)."""
    return f"{name}=${{{env or name}{':' if if_empty else ''}-{shell_word}}}"


def assign_program(name: str, prog: str) -> str:
    """`name='<program>'`: a bash program (`program`) as one quoted word for `bash -c "$name"`; its
    lines are the files and the value lines `word` checked, so a newline is its only control character."""
    if control_char(prog.replace("\n", "")):
        raise ValueError(f"program {name}: a control character other than a newline")
    return f"{name}={shlex.quote(prog)}"


def array(name: str, values: Sequence[object], width: int = 100) -> str:
    """`name=(v1 v2 ...)`, each value one quoted word; a long one goes on over lines of `width`."""
    lines, line = [], f"{name}=("
    for i, w in enumerate(map(word, values)):
        if i and len(line) + 1 + len(w) > width:
            lines.append(line)
            line = "  " + w
        else:
            line += f" {w}" if i else w
    return "\n".join([*lines, line + ")"])

"""The user guide is tried, not only written (issue 37 item 4): every `hpctrain` command in the code
blocks of README.md and docs/*.md is checked as a reader would type it, as doctests check the
examples of a docstring. Each parses with today's CLI; its config (`--config`, `--set`, `--grid`)
loads with today's keys and load-time checks, its cluster profile (`--cluster`, `--cluster-set`)
too; and each one that runs without a GPU, a cluster, a site profile the reader writes first, or
data and runs the page takes as given, is run, in a directory of its own with the checkout's
`configs/` and `recipes/` linked in. A renamed flag or key then fails here, not for the reader.

What counts as a command: in a ```bash block every line (`\\` continuations joined, `#` comments
dropped, `;`/`&&`/`|`/`>` split); in a ```console or an untagged block the lines after a `$ `
prompt, and untagged lines that start with `hpctrain` (a loop's body). Shell variables the block
sets (`C=…`, `S="…"`, `for w in 10 110`) are expanded with their (first) value. A synopsis (`<job
id>`, `[--ema]`, `…`) is no command."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpctrain import config
from hpctrain.cli import build_parser
from hpctrain.site.profile import CLUSTER_DIR, load_profile
from tests.helpers import ROOT, WAIT_S

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
ANGLED = re.compile(r"<[A-Za-z][^<>\n]*>")  # `<job id or run dir>`: read as … before the shell's < and > split
PLACEHOLDER = re.compile(r"…|\.\.\.|\s\[|^\[")
ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
LOOP = re.compile(r"\bfor ([A-Za-z_]\w*) in ([^;]+);")
VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
SEPARATORS = {";", "&&", "||", "|", "&", ">", ">>", "<"}
# The top-level commands a reader cannot run without what the page takes as given.
NEEDS = {
    "status": "a job or run of the reader's",
    "logs": "a job of the reader's",
    "eval": "a trained run (or a Slurm allocation)",
    "export": "a trained run",
    "report": "trained runs",
    "sync": "a run with tracker files",
    "train": "trains for minutes (the demo and the training tests cover it)",
    "bench": "times training steps for minutes (tests/test_bench.py runs it)",
    "doctor": "starts ranks to time all-reduces (tests/doctor covers it)",
    "notebook": "a cluster",
}


@dataclass(frozen=True)
class DocCommand:
    where: str  # page:line of the command's first line
    argv: tuple[str, ...]  # the words after `hpctrain`

    def __str__(self) -> str:
        return f"{self.where}: hpctrain {shlex.join(self.argv)}"


def command_lines(lang: str, body: str) -> list[tuple[int, str]]:
    """(line offset in the block, logical command line): continuations joined, prompts dropped. A
    block with `$ ` prompts (a console session: commands and their output) gives its prompted lines
    only; an untagged block without prompts, its lines that start with `hpctrain `."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    prompted = lang != "bash" and re.search(r"^\s*\$ ", body, re.M) is not None
    for i, line in enumerate(body.splitlines()):
        if not pending:
            start = i
            text = line.strip()
            if prompted:
                if not text.startswith("$ "):
                    continue
                line = text[2:]
            elif lang != "bash" and not text.startswith("hpctrain "):
                continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    return out


def expand(line: str, env: dict[str, str]) -> str:
    return VAR.sub(lambda m: env.get(m.group(1), m.group(0)), line)


def segments(line: str) -> list[list[str]]:
    """The simple commands of a shell line (comments dropped; split at ; && | > and the like)."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|><")
    lex.whitespace_split = True
    out: list[list[str]] = [[]]
    for token in lex:
        if token in SEPARATORS:
            out.append([])
        else:
            out[-1].append(token)
    return [s for s in out if s]


def doc_commands() -> tuple[list[DocCommand], int]:
    """Every `hpctrain` command of the pages' code blocks, and how many synopses were left out."""
    found, synopses = [], 0
    for page in PAGES:
        text = page.read_text()
        for block in FENCE.finditer(text):
            lang, body = block.group(1), block.group(2)
            first = text[: block.start()].count("\n") + 2
            env = {"PWD": "."}
            env.update((m.group(1), m.group(2).split()[0]) for m in LOOP.finditer(body))
            for offset, line in command_lines(lang, body):
                stripped = line.strip()
                if ASSIGN.match(stripped):
                    with contextlib.suppress(ValueError):
                        words = shlex.split(expand(stripped, env))
                        if len(words) == 1:  # NAME=value alone: the block's variable
                            name, _, value = words[0].partition("=")
                            env[name] = value
                            continue
                if "hpctrain" not in stripped:
                    continue
                where = f"{page.relative_to(ROOT)}:{first + offset}"
                for words in segments(ANGLED.sub("…", expand(stripped, env))):
                    if words[0] != "hpctrain":
                        continue
                    if any(PLACEHOLDER.search(f" {w}") for w in words):
                        synopses += 1
                        continue
                    found.append(DocCommand(where, tuple(words[1:])))
    return found, synopses


COMMANDS, SYNOPSES = doc_commands()


def test_the_pages_code_blocks_hold_the_commands_this_test_checks():
    """The extraction itself: the README's path from a laptop to 16 nodes is all there, a shell
    variable and a continuation are resolved, a synopsis is left out."""
    texts = [shlex.join(c.argv) for c in COMMANDS if c.where.startswith("README.md")]
    assert "plan --config vit_b16_imagenet_4k --nodes 4,8,16 --cluster mysite" in texts, texts
    assert any(
        t.startswith("submit --config vit_b16_imagenet_4k") and t.endswith("data.root=/data/imagenet-wds")
        for t in texts
    ), texts
    assert "status vit_b16_4k" in texts and "logs vit_b16_4k -f" in texts, texts
    launch = [c.argv for c in COMMANDS if c.where.startswith("docs/launch.md")]
    assert launch[0][:3] == ("submit", "--config", "configs/vit_b16_imagenet_4k.yaml"), launch  # $C expanded
    assert len(COMMANDS) >= 50 and SYNOPSES >= 10, (len(COMMANDS), SYNOPSES)


def parse(cmd: DocCommand):
    """argparse's reading of the command, or the failure with argparse's own message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser(list(cmd.argv)).parse_args(list(cmd.argv))
    except SystemExit as e:
        if e.code == 0:
            return None  # --help, --version
        pytest.fail(f"{cmd}\ndoes not parse: {err.getvalue().strip()}")


def shipped_profile(name: str | None) -> bool:
    return name is None or any(CLUSTER_DIR.glob(f"{Path(name).stem}.yaml"))


@pytest.mark.parametrize("cmd", COMMANDS, ids=str)
def test_each_doc_command_parses_with_todays_flags_and_keys(cmd: DocCommand):
    args = parse(cmd)
    if args is None:
        return
    overrides = list(getattr(args, "overrides", None) or [])
    grid = [f"{k}={v.split(',')[0]}" for k, _, v in (g.partition("=") for g in getattr(args, "grid", None) or [])]
    cfg = getattr(args, "config", None)
    if cfg or overrides or grid:
        try:
            config.load(cfg or "vit_b16_imagenet", overrides + grid)
        except config.ConfigError as e:
            pytest.fail(f"{cmd}\nits config does not load: {e}")
    profile = getattr(args, "cluster", None)
    cluster_sets = list(getattr(args, "cluster_overrides", None) or [])
    if shipped_profile(profile) and (profile or cluster_sets):
        try:
            load_profile(profile, cluster_sets)
        except config.ConfigError as e:
            pytest.fail(f"{cmd}\nits cluster profile does not load: {e}")


def why_not_run(cmd: DocCommand) -> str | None:
    """Why a reader's command cannot run in a test (None: it can)."""
    argv = cmd.argv
    word = next((a for a in argv if not a.startswith("-")), "--version")
    sub = argv[argv.index(word) + 1] if word in argv and argv.index(word) + 1 < len(argv) else ""
    cluster = argv[argv.index("--cluster") + 1] if "--cluster" in argv else None
    if word in NEEDS:
        return NEEDS[word]
    if not shipped_profile(cluster):
        return f"the site profile {cluster!r} the reader writes first (hpctrain cluster init)"
    if word == "cluster":
        return "a Slurm cluster"
    if word in ("submit", "sweep") and "--dry-run" not in argv:
        return "submits a Slurm job, or trains (README command 1: the readme-demo pass, tests/test_demo.py)"
    if word == "image" and sub in ("build", "inspect") and "--dry-run" not in argv:
        return "apptainer, or an image built by it"
    if word == "data" and sub in ("pack", "prepare-imagenet"):
        return "ImageNet"
    if word == "plan" and {"--bench-results", "--allreduce-results"} & set(argv):
        return "bench and doctor results of the reader's"
    outside = [a for a in argv if re.match(r"(\S+=)?/", a)]
    if outside:
        return f"a path of the reader's machine: {outside[0]}"
    return None


RUNNABLE = [c for c in COMMANDS if why_not_run(c) is None]


def test_the_commands_run_here_are_the_ones_a_reader_can_run_anywhere():
    """The runnable set is not empty by accident: the listings, the dry runs and the plans are in it."""
    words = {c.argv[0] for c in RUNNABLE}
    assert {"--version", "config", "image", "submit", "plan", "sbatch-template"} <= words, sorted(words)


@pytest.mark.parametrize("cmd", RUNNABLE, ids=str)
def test_each_doc_command_that_needs_no_gpu_cluster_or_data_runs(cmd: DocCommand, tmp_path):
    for name in ("configs", "recipes"):
        (tmp_path / name).symlink_to(ROOT / name)
    argv = [a for arg in cmd.argv for a in (sorted(map(str, tmp_path.glob(arg))) or [arg] if "*" in arg else [arg])]
    env = dict(os.environ, HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / ".config"))
    r = subprocess.run(
        [sys.executable, "-m", "hpctrain", *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert r.returncode == 0, f"{cmd}\nexit {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"


def cli_commands() -> list[tuple[str, ...]]:
    """Every command of the CLI and each sub-command under it (`data pack`, `image inspect`,
    `config migrate`): a sub-parser's names, or the choices of a command's first positional."""
    out: list[tuple[str, ...]] = []
    top = next(a for a in build_parser([])._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in top.choices.items():
        out.append((name,))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                out += [(name, sub) for sub in action.choices]
            elif not action.option_strings and action.choices:
                out += [(name, str(sub)) for sub in action.choices]
    return out


def test_commands_page_has_a_row_for_every_command_and_sub_command():
    """docs/commands.md says it lists every `hpctrain` command: a new command (or sub-command) needs
    its row there."""
    cell = r"(?:[^|\\]|\\.)*"  # a table cell: `\|` inside it is no column's end
    firsts = re.findall(rf"^\| (`hpctrain {cell})\|", (ROOT / "docs" / "commands.md").read_text(), re.M)
    commands = cli_commands()
    assert len(commands) > 25 and ("notebook",) in commands and ("data", "pack") in commands, commands

    def has_row(cmd: tuple[str, ...]) -> bool:
        words = [rf"\b{re.escape(w)}\b" for w in cmd[1:]]
        return any(f"`hpctrain {cmd[0]}" in row and all(re.search(w, row) for w in words) for row in firsts)

    missing = [" ".join(cmd) for cmd in commands if not has_row(cmd)]
    assert not missing, f"docs/commands.md has no row for: {', '.join(missing)}"


def has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


def fast_tier_block() -> tuple[int, str]:
    """README's fast tier: the count it states and its command's `-m` expression."""
    text = (ROOT / "README.md").read_text()
    stated = re.search(r"(\d+) tests \(`--collect-only`", text)
    command = re.search(r'^python -m pytest .*-m "([^"]+)" tests$', text, re.M)
    assert stated and command, "README.md no longer states the fast tier as `N tests (`--collect-only`…` + its command"
    return int(stated.group(1)), command.group(1)


# What a module skipped at collection needs (pytest.importorskip): without one of them here, the
# count is README command 1's venv's, not the figure's (every extra, as `.ci/run` installs them).
EXTRA_MODULES = ("nvidia.dali", "pyarrow", "mlflow", "wandb")


@pytest.mark.slow  # collects the whole suite (~15 s on 2 cores)
def test_readme_fast_tier_count_is_what_collect_only_finds():
    """The README's fast-tier figure is the count of its own command's `--collect-only`, with every
    extra installed (as `.ci/run` has it). To update it, write the count this test prints."""
    missing = [m for m in EXTRA_MODULES if not has(m)]
    if missing:
        pytest.skip(f"not installed here: {', '.join(missing)}; README's count is with every extra (.ci/run)")
    stated, marks = fast_tier_block()
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", marks, "tests"],
        cwd=ROOT,
        env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    last = r.stdout.strip().splitlines()[-1]
    found = re.match(r"(\d+)(?:/\d+)? tests? collected", last)
    assert r.returncode == 0 and found, r.stdout[-3000:] + r.stderr[-3000:]
    assert int(found.group(1)) == stated, f"README.md says {stated} fast-tier tests; collect-only: {last}"

"""Every module a docstring or comment of src/ names exists, so prose does not drift when code moves.

Checked forms: `hpctrain.x.y` (a module, or a name defined at the top of one), `x.y` whose first part
is a subpackage of hpctrain (unless it is a config key such as `train.epochs` or an old one, keys
`data.erase_*`, a file name such as `plan.md`, or in NOT_MODULES), and a path `x/y.py` (from the
repository, src/, src/hpctrain or the file's own folder; other projects' paths are in FOREIGN).
The source is read, not imported: the test is fast and needs no torch."""

from __future__ import annotations

import ast
import dataclasses
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

from hpctrain.config import Config
from hpctrain.config_moves import MOVES
from tests.helpers import ROOT

SRC = ROOT / "src"
PKG = SRC / "hpctrain"
SUBPACKAGES = {p.name for p in PKG.iterdir() if (p / "__init__.py").exists()}
CONFIG_KEYS = {
    f"{s.name}.{k.name}" for s in dataclasses.fields(Config) for k in dataclasses.fields(s.default_factory())
} | {m.old for m in MOVES}  # a key's old name, as config_moves.py writes it
# other projects' files, named where the code follows them
FOREIGN = ("timm/", "submitit/", "core/utils.py", "configs/vit_s16_i1k.py")
NOT_MODULES = {  # dotted names in prose that are other things, each with what it is
    "hpctrain.run_key": "the MLflow tag a run is found by",
    "run.step": "a wandb Run's attribute",
    "images.shape": "a DALI DataNode's method",
}
FILE_SUFFIXES = {"md", "py", "sh", "yaml", "yml", "json", "jsonl", "txt", "conf", "cc", "toml", "cfg"}

DOTTED = re.compile(r"(?<![\w.])((?:hpctrain\.)?[a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+)")
PY_PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w-]+\.py)\b")


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of each comment and docstring in `path`."""
    text = path.read_text()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc


def module_file(parts: list[str]) -> Path | None:
    base = PKG.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def dotted_problem(name: str) -> str | None:
    """Why the dotted `name` (without `hpctrain.`) names nothing, or None when it does."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        found = module_file(parts[:n])
        if found is not None:
            if n == len(parts) or parts[n] in top_level_names(found) or module_file(parts[: n + 1]):
                return None
            return f"{'.'.join(parts[:n])} defines no {parts[n]!r}"
    return f"no module hpctrain.{parts[0]}"


def named_modules(path: Path) -> Iterator[tuple[int, str, str]]:
    """(line, name as written, problem) for each module name in the prose of `path` that names nothing."""
    for line, text in prose(path):
        for m in DOTTED.finditer(text):
            name = m[1]
            family = text[m.end() : m.end() + 1] == "*"  # `data.erase_*`: the config keys starting so
            if name in NOT_MODULES or (family and any(key.startswith(name) for key in CONFIG_KEYS)):
                continue
            if name.startswith("hpctrain."):
                name = name.removeprefix("hpctrain.")
            elif name.split(".")[0] not in SUBPACKAGES or name in CONFIG_KEYS or name.rsplit(".")[-1] in FILE_SUFFIXES:
                continue
            if problem := dotted_problem(name):
                yield line + text.count("\n", 0, m.start()), m[1], problem
        for m in PY_PATH.finditer(text):
            written = m[1]
            if written.startswith(FOREIGN):
                continue
            bases = (ROOT, SRC, PKG, path.parent)
            if not any((base / written).exists() for base in bases):
                yield line + text.count("\n", 0, m.start()), written, "no such file"


def test_every_module_named_in_a_docstring_or_comment_exists():
    stale = [
        f"{path.relative_to(ROOT)}:{line}: {name} ({problem})"
        for path in sorted(PKG.rglob("*.py"))
        for line, name, problem in named_modules(path)
    ]
    assert not stale, "prose names what is not there (write the module's current name):\n" + "\n".join(stale)


def test_a_moved_module_is_found(tmp_path):
    """The check sees each form of a stale name and passes the current ones (the test above can fail)."""
    module = tmp_path / "m.py"
    module.write_text(
        '"""See hpctrain.train.checkpointer, train.rollback and train/guard.py; not train.epochs or plan.md."""\n'
        "# hpctrain.train.loop.Trainer and train/loop.py are where they are; so is hpctrain.config.nosuch\n"
    )
    assert [(name, problem) for _, name, problem in named_modules(module)] == [
        ("hpctrain.config.nosuch", "config defines no 'nosuch'"),
        ("hpctrain.train.checkpointer", "train defines no 'checkpointer'"),
        ("train.rollback", "train defines no 'rollback'"),
        ("train/guard.py", "no such file"),
    ]

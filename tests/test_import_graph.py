"""The import graph as written at the top of each module (what a reader and a tool see) has no
cycle, and every import left inside a function says why in a comment (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

from hpctrain.cli import COMMANDS

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "hpctrain"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def top_level_imports(name: str, path: Path) -> set[str]:
    """The hpctrain modules `name` imports at module level (`from a import b`: a.b when b is a module)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("hpctrain")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hpctrain"):
            out |= {
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module for a in node.names
            }
    return {m for m in out if m in MODULES and m != name}


def function_level_imports(path: Path) -> list[tuple[int, str]]:
    lines = path.read_text().splitlines()
    out = []
    for fn in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    out.append((node.lineno, lines[node.lineno - 1]))
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n) :] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_module_level_imports_have_no_cycle():
    graph = {name: top_level_imports(name, path) for name, path in MODULES.items()}
    assert sum(map(len, graph.values())) > 200  # the graph was read
    # a package's __init__ that re-exports its modules points down only
    assert find_cycle(graph) is None, " → ".join(find_cycle(graph))


def train_subpackages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The packages of one concern under train/ (optim, ckpt, health, observe) and which imports which."""

    def sub(m: str) -> str | None:
        parts = m.split(".")
        return parts[2] if len(parts) > 3 and parts[1] == "train" else None

    out: dict[str, set[str]] = {s: set() for m in graph if (s := sub(m))}
    for m, deps in graph.items():
        out.get(sub(m) or "", set()).update(b for n in deps if (b := sub(n)) and b != sub(m))
    return out


def test_train_subpackages_import_each_other_without_a_cycle():
    """Module-level acyclic is not enough for a package to stand apart: two of train's packages that
    import each other are one concern split in two (docs/architecture.md, "Layers")."""
    graph = train_subpackages({name: top_level_imports(name, path) for name, path in MODULES.items()})
    assert {"optim", "ckpt", "health", "observe"} <= set(graph)  # the packages were found
    assert find_cycle(graph) is None, " → ".join(find_cycle(graph))


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    split = {"hpctrain.train.a.x": {"hpctrain.train.b.y"}, "hpctrain.train.b.y": {"hpctrain.train.a.z"}}
    assert find_cycle(train_subpackages(split)) == ["a", "b", "a"]  # module-level acyclic, packages not


def test_every_function_level_import_says_why():
    """An import left inside a function (a heavy optional package, an order the stop handlers need)
    says why in a `#` comment: on its line, on the line above, or on the first import of its block
    (consecutive import lines, blank lines between); anything else goes to the module's top."""
    bare = []
    for path in MODULES.values():
        lines = path.read_text().splitlines()
        said = set()  # line numbers of function-level imports whose reason is given
        for lineno, line in sorted(function_level_imports(path)):
            prev = lineno - 1
            while prev > 0 and not lines[prev - 1].strip():
                prev -= 1
            above = lines[prev - 1].strip() if prev > 0 else ""
            if "#" in line or (prev == lineno - 1 and above.startswith("#")) or prev in said:
                said.add(lineno)
            else:
                bare.append(f"{path.relative_to(SRC)}:{lineno}: {line.strip()}")
    assert len(MODULES) > 100  # the package was read
    assert not bare, "function-level imports without a comment saying why:\n" + "\n".join(bare)


def all_imports(path: Path) -> set[str]:
    """Every module `path` imports, at any level (`from a import b`: a and a.b)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return out


SUBMITIT_GLUE = "hpctrain.launch.submitit_glue"


def test_submitit_is_imported_by_one_module_only():
    """submitit's private API is pinned and checked in one place (tests/launch/test_submitit_contract.py)."""
    importers = sorted(
        name
        for name, path in MODULES.items()
        if any(m == "submitit" or m.startswith("submitit.") for m in all_imports(path))
    )
    assert importers == [SUBMITIT_GLUE]


def test_no_cli_command_imports_another():
    """`cli/` parses and prints; what a command does lives in the library (launch.prepare for the
    submission), so one command module never reaches into another. What commands share (the
    package's __init__, cli.common, cli.job) imports no command either."""
    commands = {f"hpctrain.cli.{m}" for m in COMMANDS.values()}
    assert len(commands) > 10 and commands <= set(MODULES)  # the dispatcher's table was read
    shared = {n for n in MODULES if n.startswith("hpctrain.cli.") and n not in commands} | {"hpctrain.cli"}
    crossing = [
        f"{name} imports {m}"
        for name in sorted(commands)
        for m in sorted(all_imports(MODULES[name]))
        if m in commands and m != name
    ]
    assert not crossing, "\n".join(crossing)
    leaning = [
        f"{name} imports {m}" for name in sorted(shared) for m in sorted(all_imports(MODULES[name])) if m in commands
    ]
    assert not leaning, "\n".join(leaning)


# The layers of the package, bottom first (docs/architecture.md, "Packages and layers"). A module
# imports its own package, the base modules, and the layers below its own; two packages of one
# layer never import each other. A top-level module not named here is a base module.
LAYERS: list[tuple[str, ...]] = [
    ("models",),  # ViT shapes (torch-free) and the model
    ("<base>",),  # config, errors, memory, flops, pids, …: one concern each
    ("run",),  # the run directory as code: its files, records, lock and rules (torch-free)
    ("version",),  # which hpctrain runs: the source hash of run.source
    ("site", "images", "data"),  # what a cluster is; container images; loaders (data.prep: preparation)
    ("plan",),  # estimates and public figures, torch-free: the planner and the task's checks read them
    ("train",),  # the task's training core
    ("allreduce", "bench", "watch"),  # measurements built on the core; reading a run back (login node)
    ("launch", "doctor"),  # jobs (login node, batch shell, task entry, the notebook job); site checks
    ("cli",),
    ("__main__",),
]


# Base modules grown into a package of one concern per module: still <base> (lr_rule, a base module,
# imports config, and config imports errors, shipped, optim_spec), so a layer of their own would
# stand both above and below <base>; inside, the module-level graph has no cycle as anywhere else.
BASE_PACKAGES = ("config",)


def unit_of(module: str) -> str:
    """A subpackage's name, a top-level module's own name, or <base>."""
    parts = module.split(".")
    named = {u for layer in LAYERS for u in layer}
    if len(parts) >= 2 and parts[1] in BASE_PACKAGES:
        return "<base>"
    if len(parts) > 2 or (len(parts) == 2 and (PKG / parts[1]).is_dir()):
        return parts[1]
    unit = parts[-1] if len(parts) == 2 else "<base>"
    return unit if unit in named else "<base>"


def layer_breaks(graph: dict[str, set[str]]) -> list[str]:
    rank = {u: i for i, layer in enumerate(LAYERS) for u in layer}
    out = []
    for m, deps in sorted(graph.items()):
        a = unit_of(m)
        for n in sorted(deps):
            b = unit_of(n)
            if a == b or (rank[b] < rank[a]):
                continue
            out.append(f"{m} → {n} ({a} may not import {b})")
    return out


def test_packages_import_only_their_own_layer_or_below():
    graph = {name: top_level_imports(name, path) for name, path in MODULES.items()}
    units = {unit_of(m) for m in MODULES}
    assert units <= {u for layer in LAYERS for u in layer}, f"packages without a layer: {units}"
    breaks = layer_breaks(graph)
    assert not breaks, "imports against the layers (move the code down, or the import up):\n" + "\n".join(breaks)


def test_the_layer_rule_refuses_an_import_up_and_across():
    assert layer_breaks({"hpctrain.config": {"hpctrain.data.randaug"}}) == [
        "hpctrain.config → hpctrain.data.randaug (<base> may not import data)"
    ]
    assert layer_breaks({"hpctrain.site.fabric": {"hpctrain.data.build"}})  # across one layer
    assert not layer_breaks({"hpctrain.train.loop": {"hpctrain.data.build", "hpctrain.config"}})
    assert layer_breaks({"hpctrain.config.schema": {"hpctrain.run.layout"}}) == [
        "hpctrain.config.schema → hpctrain.run.layout (<base> may not import run)"
    ]  # a base package's modules are base modules
    assert not layer_breaks({"hpctrain.lr_rule": {"hpctrain.config.schema"}})

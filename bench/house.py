"""The house in figures, for issue 57's before/after: modules, lines, the longest files and functions,
imports against the layers and import cycles (tests/test_import_graph.py's rules), function-level
imports, and bash left in the renderers' Python strings.

    python bench/house.py [--repo DIR] [--json OUT]

`--repo` measures another checkout (e.g. a `git worktree` of an older commit) with this file's rules.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def functions(tree: ast.AST) -> list[tuple[int, str]]:
    return [
        (n.end_lineno - n.lineno + 1, n.name)
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def measure(repo: Path) -> dict:
    sys.path.insert(0, str(HERE))  # this checkout's test rules, applied to `repo`'s source
    from tests import test_import_graph as g  # the rules live in the test (a bench reads them, not a copy)

    pkg = repo / "src" / "hpctrain"
    g.SRC, g.PKG = repo / "src", pkg
    g.MODULES = {g.module_name(p): p for p in sorted(pkg.rglob("*.py"))}
    graph = {name: g.top_level_imports(name, path) for name, path in g.MODULES.items()}
    files, funcs, inner = [], [], 0
    for path in g.MODULES.values():
        text = path.read_text()
        tree = ast.parse(text)
        files.append((len(text.splitlines()), str(path.relative_to(pkg))))
        funcs += [(n, f"{path.relative_to(pkg)}:{f}") for n, f in functions(tree)]
        inner += len(g.function_level_imports(path))
    files.sort(reverse=True)
    funcs.sort(reverse=True)
    shell = sorted((pkg / "launch" / "shell").glob("*.sh"))
    silenced = [p.name for p in shell if p.read_text().startswith("# shellcheck shell=bash disable=")]
    return {
        "modules": len(g.MODULES),
        "lines": sum(n for n, _ in files),
        "longest_files": files[:5],
        "longest_functions": funcs[:5],
        "layer_breaks": len(g.layer_breaks(graph)),
        "cycle": g.find_cycle(graph),
        "function_level_imports": inner,
        "shell_files": len(shell),
        "shell_files_silenced_file_wide": len(silenced),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=HERE)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    fig = measure(args.repo.resolve())
    for k, v in fig.items():
        print(f"{k}: {v}")
    if args.json:
        args.json.write_text(json.dumps(fig, indent=1) + "\n")


if __name__ == "__main__":
    main()

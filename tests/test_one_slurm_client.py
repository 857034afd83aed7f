"""One Slurm client: no module of hpctrain but site/slurm_cli.py runs a Slurm command (sbatch, squeue,
sacct, scontrol, sinfo, sacctmgr, sshare, scancel, srun, salloc) in a process of its own, so that
every call is logged, retried and cached in one place (docs/sites.md, "Slurm calls hpctrain makes").

Read from the source (ast): a function (or module body) that starts a process (subprocess.*, os.system,
os.exec*/spawn*/popen, submitit's CommandFunction) may not name a Slurm command in any string in it,
whether in the argv itself, a list built before it or a `bash -c` line. The batch shell's calls are
launch/shell/*.sh's (tests/launch/test_shell_files.py); a Slurm command written into a batch script
is text, not a call from Python.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

from hpctrain.site.slurm_cli import COMMANDS

PKG = Path(__file__).resolve().parents[1] / "src" / "hpctrain"
CLIENT = PKG / "site" / "slurm_cli.py"

PROCESS_CALLS = {
    ("subprocess", n) for n in ("run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput")
} | {("os", n) for n in ("system", "popen", "execv", "execvp", "execvpe", "execl", "execlp", "spawnv", "spawnvp")}
PROCESS_NAMES = {"CommandFunction", "create_subprocess_exec", "create_subprocess_shell"}
WORDS = re.compile(r"[^\s;|&()`$'\"<>=]+")


def starts_process(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute):
        base = f.value.id if isinstance(f.value, ast.Name) else ""
        return (base, f.attr) in PROCESS_CALLS or f.attr in PROCESS_NAMES
    return isinstance(f, ast.Name) and f.id in PROCESS_NAMES


def slurm_words(node: ast.AST) -> set[str]:
    """The Slurm commands named by the string constants under `node` (as a word: `squeue -j`, `bash -c
    'sacct …'`, a path ending in /sbatch)."""
    out = set()
    for c in ast.walk(node):
        if isinstance(c, ast.Constant) and isinstance(c.value, str):
            out |= {Path(w).name for w in WORDS.findall(c.value)} & set(COMMANDS)
    return out


def scopes(tree: ast.Module):
    """Each function, and the module body outside functions."""
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    yield "<module>", ast.Module(body=[n for n in tree.body if n not in funcs], type_ignores=[])
    yield from ((getattr(f, "name", "<lambda>"), f) for f in funcs)


def offenders(source: str) -> list[str]:
    """`function: command` for each scope that starts a process and names a Slurm command."""
    out = []
    for name, scope in scopes(ast.parse(source)):
        if any(starts_process(n) for n in ast.walk(scope)):
            out += [f"{name}: {w}" for w in sorted(slurm_words(scope))]
    return out


def test_the_checker_finds_a_slurm_command_however_the_argv_is_built():
    caught = {
        "direct": 'import subprocess\ndef f(j):\n    subprocess.run(["squeue", "-j", j])\n',
        "built before": 'import subprocess\ndef f(p):\n    cmd = ["sbatch", "-W"]\n    subprocess.run([*cmd, p])\n',
        "shell line": 'import subprocess\ndef f():\n    subprocess.run(["bash", "-c", "sacct -X | head"])\n',
        "a path": 'import os\ndef f():\n    os.system("/usr/bin/scontrol ping")\n',
        "submitit's runner": "def f(p):\n    return utils.CommandFunction(['/opt/slurm/bin/sbatch', p])()\n",
        "module level": 'import subprocess\nsubprocess.check_output(["sinfo"])\n',
    }
    for what, src in caught.items():
        assert offenders(src), what
    # what is allowed: the client, a Slurm command as text, a process that is not Slurm's
    assert not offenders('from hpctrain.site.slurm_cli import tool\ndef f(j):\n    return tool("squeue", "-j", j)\n')
    assert not offenders('def f(j):\n    return f"end it: scancel {j}"\n')
    assert not offenders('import subprocess\ndef f():\n    subprocess.run(["git", "status"])\n')


def test_no_module_but_slurm_cli_runs_a_slurm_command():
    found = {str(p.relative_to(PKG)): offenders(p.read_text()) for p in sorted(PKG.rglob("*.py")) if p != CLIENT}
    assert len(list(PKG.rglob("*.py"))) > 100  # the package was read
    bad = {k: v for k, v in found.items() if v}
    assert not bad, "run these through hpctrain.site.slurm_cli (tool/ask/run): " + textwrap.shorten(str(bad), 2000)
    # and the client itself is what runs them
    assert any(starts_process(n) for n in ast.walk(ast.parse(CLIENT.read_text())))

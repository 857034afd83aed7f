"""The short dry run (`--dry-run`): what a reviewer checks of a batch script, beside the whole script
(`--dry-run=full`, `hpctrain submit --emit-sbatch`). About 90 lines where the script has over 1,000.

Four parts: the script's `#SBATCH` header (as written); the environment the tasks get (the batch
shell's own exports as written, srun passes them on: srun_env.sh; the modules; what the container's
runtime passes into the image); the step command with the runtime's words filled in, as the step
runs it (container.task_words); one line per launch/shell/*.sh part the script inlines (its
`# summary:` line), so that the rest of the script is named, not hidden.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Sequence

from hpctrain import shellfile
from hpctrain.launch.container import task_env, task_words
from hpctrain.launch.sbatch import STEP_SRUN, JobPlan, binding, render
from hpctrain.site import runtimes
from hpctrain.site.fabric import left_to_nccl
from hpctrain.site.profile import ClusterProfile
from hpctrain.site.runtimes.base import PASS_ENV, PY_VAR

SHORT, FULL = "short", "full"
WIDTH = 110  # the step command and the lists wrap here
PYTHON_HOOK = f'"${{{PY_VAR}[@]}}"'  # where a step's command starts the tasks' Python
EXPORT = re.compile(r"export ([A-Za-z_]\w*)(=.*)?$")
ASSIGN = re.compile(r"([A-Za-z_]\w*)=(.*)$")
PROGRAM = re.compile(r"\s*[A-Za-z_]\w*='[^']*$")  # a multi-line single-quoted value's first line
QUOTED_QUOTE = "'\"'\"'"  # a ' inside it (shlex.quote)
WORD = re.compile(r"""(?:[^\s'"\\]+|'[^']*'|"(?:[^"\\]|\\.)*"|\\.)+""")  # a shell word, as written


def add_arg(p: argparse.ArgumentParser, what: str = "the batch script", help: str | None = None) -> None:
    """`--dry-run` (short) and `--dry-run=full`, the same on every command that has a batch script."""
    p.add_argument(
        "--dry-run",
        nargs="?",
        const=SHORT,
        choices=(SHORT, FULL),
        metavar="full",
        help=help
        or f"submit nothing: print {what}'s #SBATCH header, the tasks' environment, the step command and a "
        "line per shell part it inlines; --dry-run=full: the whole script",
    )


def wrap(groups: Sequence[Sequence[str]], indent: str = "  ", width: int = WIDTH) -> list[str]:
    """Shell words over lines of `width`, each group of words on lines of its own, each line but the
    last ending in ` \\`."""
    lines = []
    for words in groups:
        line = ""
        for w in words:
            if line and len(indent) + len(line) + 1 + len(w) > width:
                lines.append(line)
                line = w
            else:
                line = f"{line} {w}" if line else w
        lines += [line] if line else []
    return [f"{indent if i else ''}{ln}" + (" \\" if i < len(lines) - 1 else "") for i, ln in enumerate(lines)]


def header(script: str) -> list[str]:
    """The shebang, the comment lines under it and the `#SBATCH` lines, as written."""
    out = []
    for line in script.splitlines():
        if not line.startswith("#"):
            break
        out.append(line)
    return out


def exports(script: str) -> list[str]:
    """The batch shell's own exports, in order: the script's unindented `export` lines and those of
    the parts' setup functions (run once by the main: shellfile.setup_calls); a bare `export NAME`
    with the value of its `NAME=` line."""
    values: dict[str, str] = {}
    out, program, setup = [], False, False
    for line in script.splitlines():
        if setup:  # a setup function's own lines, one level in
            setup = line != "}"
            line = line.removeprefix("  ")
        elif shellfile.SETUP.match(line):
            setup = True
            continue
        if program:  # a program's text for another bash (a task's, a probe step's), not this shell's own lines
            program = line.replace(QUOTED_QUOTE, "").count("'") % 2 == 0  # its closing quote ends it
        elif PROGRAM.match(line):
            program = True
        elif m := ASSIGN.match(line):
            values[m[1]] = m[2]
        elif m := EXPORT.match(line):
            out.append(line if m[2] else f"export {m[1]}={values.get(m[1], '')}".rstrip("="))
    return out


def modules(prof: ClusterProfile) -> list[str]:
    """What the batch shell loads before the step (modules.job_module_lines), in one or two lines."""
    none = not runtimes.get(prof.container.runtime).image_kind  # the host's Python
    names = prof.modules if none else prof.container_modules
    setup = "".join(f"module use {shlex.quote(u)}; " for u in prof.module_use) + ("module purge; " * prof.module_purge)
    why = "HPCTRAIN_MODULES" if none else "HPCTRAIN_CONTAINER_MODULES: the runtime's command, not seen in the image"
    out = [f"# modules: {setup}module load {' '.join(names)} ({why})" if names else "# modules: none"]
    if not none and prof.modules:
        out.append(f"#   HPCTRAIN_MODULES ({' '.join(prof.modules)}) are loaded only with CONTAINER=none")
    return out


def environment(script: str, prof: ClusterProfile, source: str, step: bool = True) -> list[str]:
    """The environment the tasks get: the batch shell's exports, NCCL's own choices (`step`: the tasks
    of an srun step, which talk over the fabric), the modules, and what the container passes into the image."""
    c = prof.container
    where, own = task_env(c, source)
    lines = [
        "# The tasks' environment: the batch shell's exports "
        + ("(srun passes them on, srun_env.sh)" if step else "(the task is its child)"),
        *exports(script),
        *(left_to_nccl(prof)[:1] if step else []),
        *modules(prof),
    ]
    if runtimes.get(c.runtime).image_kind:
        allowed = wrap([[f"# in the image ({c.runtime}): only", *PASS_ENV, *c.pass_env, "pass from the host"]], "#   ")
        lines += [ln.removesuffix(" \\") for ln in allowed]
    lines += [f"# the tasks' Python ({where}):"] if own else []
    return lines + [f"export {v}" if where.startswith("exported") else f"#   {v}" for v in own]


def step(srun: Sequence[str], python: Sequence[str], command: str) -> list[str]:
    """A step command: `srun` and its options, then `command` with $HPCTRAIN_PYTHON's words in place."""
    before, _, after = command.partition(PYTHON_HOOK)
    return wrap([units(srun), units(WORD.findall(before)), units(python), units(WORD.findall(after))])


def units(words: Sequence[str]) -> list[str]:
    """Words as the units a line breaks between: an option that takes a value stays beside it."""
    out: list[str] = []
    for w in words:
        if out and out[-1].startswith("-") and " " not in out[-1] and not w.startswith("-"):
            out[-1] += f" {w}"
        else:
            out.append(w)
    return out


def parts(names: Sequence[shellfile.Shell]) -> list[str]:
    """One line per shell part: its file name and its `# summary:`."""
    width = max((len(shellfile.label(n)) for n in names), default=0)
    return [f"{shellfile.label(n):<{width}}  {shellfile.summary(n)}" for n in names]


def assemble(script: str, inlined: Sequence[shellfile.Shell], env: list[str], steps: list[str], step_note: str) -> str:
    """The four parts, each under its comment; `step_note` says when the step runs."""
    lines = [*header(script), "", *env, "", f"# {step_note}", *steps]
    if inlined:
        lines += ["", "# The shell parts the script inlines (launch/shell/*.sh; the whole script: --dry-run=full)"]
        lines += parts(inlined)
    return "\n".join(lines) + "\n"


def job_brief(
    p: JobPlan, command: str, host_python: str, extra_env: dict[str, str] | None = None, source: str = ""
) -> str:
    """The short dry run of the script launch.sbatch.render makes for a submission (not the stand-alone
    one): `command` with its PYTHON_HOOK, `source` the code snapshot's path ("": the image's own)."""
    with shellfile.recording() as inlined:
        script = render(p, command, host_python, False, extra_env, shlex.quote(source) if source else "''")
    prof = p.profile
    workdir = "$PWD" if p.workdirs or not p.chdir else p.chdir
    srun, python = task_words(prof.container, p.binds, host_python, source, workdir, bool(p.nsys_ranks))
    steps = step([*STEP_SRUN.split(), *map(shlex.quote, binding(p)), *srun], python, command)
    note = (
        "The step: in the background, at each attempt and in-job restart; nodes a fault left out get "
        "--exclude (exclude.sh)"
    )
    if p.workdirs:  # a sweep's array: the step runs in the element's own run directory
        first = shlex.quote(p.workdirs[0])
        note += f"\n# Job array: element i runs in run directory i, from {first} ({len(p.workdirs)} in all)"
    return assemble(script, inlined, environment(script, prof, source), steps, note)

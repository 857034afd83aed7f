"""Environment-module lines for the batch script: `module` works even in a non-login batch shell.

Sites differ (docs/launch.md "Slurm", `module_purge`): `module purge` can remove what the job needs (`apptainer`
itself; `slurm` on Bright/BCM clusters), so purging is the profile's choice, off by default; and
`cuda`/`nccl` modules do nothing for a job inside an image (Apptainer replaces LD_LIBRARY_PATH)
while their CUDA_HOME/PYTHONPATH would leak in, so a profile names separate `container_modules`.
"""

from __future__ import annotations

import shlex

from hpctrain import shellfile


def load_lines(names: str, module_use: list[str] = (), purge: bool = False, indent: str = "  ") -> list[str]:
    """Source the module system's init when `module` is missing (a plain `bash script` lacks the
    login shell's function: shell/module_init.sh), then [purge and] load `names` (a shell word list,
    split on purpose)."""
    lines = shellfile.lines("module_init.sh", indent)
    lines += [f"{indent}module use {shlex.quote(p)}" for p in module_use]
    if purge:
        lines.append(f"{indent}module purge")
    lines.append(f"{indent}module load {names}  # word-split on purpose: one name per word")
    return lines


def module_lines(
    modules: list[str], module_use: list[str] = (), var: str = "HPCTRAIN_MODULES", purge: bool = False
) -> list[str]:
    """Lines that load `$var` (default: `modules`); none when nothing to load. A module that fails
    to load stops the job."""
    if not modules:
        return []
    return [
        f"{var}=${{{var}-{shlex.quote(' '.join(modules))}}}",
        f'if [ -n "${var}" ]; then',
        *load_lines(f"${var}", module_use, purge),
        "fi",
    ]


def job_module_lines(
    modules: list[str], container_modules: list[str], module_use: list[str] = (), purge: bool = False
) -> list[str]:
    """The batch script's modules: HPCTRAIN_MODULES for tasks on the host's Python (a module that
    fails stops the job), HPCTRAIN_CONTAINER_MODULES for tasks in the image (chosen by $CONTAINER at
    run time): those only bring the runtime, which a site may have on PATH without a module or
    without Lmod, so there a failed load is a warning and only a missing runtime stops the job
    (shell/container_modules.sh)."""
    if not modules and not container_modules:
        return []
    setup = [f"module use {shlex.quote(p)}" for p in module_use] + (["module purge"] if purge else [])
    return [
        f"HPCTRAIN_MODULES=${{HPCTRAIN_MODULES-{shlex.quote(' '.join(modules))}}}",
        f"HPCTRAIN_CONTAINER_MODULES=${{HPCTRAIN_CONTAINER_MODULES-{shlex.quote(' '.join(container_modules))}}}",
        'if [ "$CONTAINER" = none ]; then hpctrain_modules=$HPCTRAIN_MODULES; '
        "else hpctrain_modules=$HPCTRAIN_CONTAINER_MODULES; fi",
        'if [ -n "$hpctrain_modules" ] && [ "$CONTAINER" = none ]; then',
        *load_lines("$hpctrain_modules", module_use, purge),
        'elif [ -n "$hpctrain_modules" ]; then',
        *shellfile.lines("module_init.sh", "  "),
        *(["  if type module >/dev/null 2>&1; then", *(f"    {c}" for c in setup), "  fi"] if setup else []),
        *shellfile.lines("container_modules.sh", "  "),
        "fi",
    ]

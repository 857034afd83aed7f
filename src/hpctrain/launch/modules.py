"""Environment-module lines for the batch script: `module` works even in a non-login batch shell.

Sites differ (docs/launch.md "Slurm", `module_purge`): `module purge` can remove what the job needs (`apptainer`
itself; `slurm` on Bright/BCM clusters), so purging is the profile's choice, off by default; and
`cuda`/`nccl` modules do nothing for a job inside an image (Apptainer replaces LD_LIBRARY_PATH)
while their CUDA_HOME/PYTHONPATH would leak in, so a profile names separate `container_modules`.
The bash is in launch/shell/module_*.sh (job_modules.sh, modules_of.sh pick what to load); here the values.
"""

from __future__ import annotations

from hpctrain import shellfile
from hpctrain.site import runtimes


def load_lines(module_use: list[str] = (), purge: bool = False) -> list[str]:
    """Source the module system's init when `module` is missing (a plain `bash script` lacks the
    login shell's function: shell/module_init.sh), then `module use` and `module purge` as the profile
    asks: files inlined only then, so that a script without a purge names none."""
    lines = shellfile.lines("module_init.sh")
    if module_use:
        lines += [shellfile.array("hpctrain_module_use", list(module_use)), *shellfile.lines("module_use.sh")]
    return lines + (shellfile.lines("module_purge.sh") if purge else [])


def module_lines(
    modules: list[str], module_use: list[str] = (), var: str = "HPCTRAIN_MODULES", purge: bool = False
) -> list[str]:
    """Lines that load `$var` (default: `modules`); none when nothing to load. A module that fails
    to load stops the job."""
    if not modules:
        return []
    return [
        shellfile.default(var, " ".join(modules)),
        shellfile.assign("hpctrain_modules_var", var),
        *shellfile.lines("modules_of.sh"),
        *load_lines(module_use, purge),
        *shellfile.lines("module_load.sh"),
    ]


def job_module_lines(
    modules: list[str], container_modules: list[str], module_use: list[str] = (), purge: bool = False
) -> list[str]:
    """The batch script's modules: HPCTRAIN_MODULES for tasks on the host's Python (a module that
    fails stops the job), HPCTRAIN_CONTAINER_MODULES for tasks in the image (chosen by $CONTAINER at
    run time: shell/job_modules.sh): those only bring the runtime, which a site may have on PATH without
    a module or without Lmod, so there a failed load is a warning and only a missing runtime stops the
    job (shell/container_modules.sh)."""
    if not modules and not container_modules:
        return []
    return [
        shellfile.default("HPCTRAIN_MODULES", " ".join(modules)),
        shellfile.default("HPCTRAIN_CONTAINER_MODULES", " ".join(container_modules)),
        *shellfile.lines("job_modules.sh"),
        *load_lines(module_use, purge),
        *shellfile.lines("module_load.sh"),
        shellfile.assign("hpctrain_runtime_commands", f" {' '.join(runtime_commands())} "),
        *shellfile.lines("container_modules.sh"),
    ]


def runtime_commands() -> list[str]:
    """The commands the runtimes start each task with (apptainer, singularity): the one of $CONTAINER
    must be on PATH once the container modules are loaded; pyxis has none (srun starts the image)."""
    return [r.command for r in runtimes.REGISTRY.values() if r.command]

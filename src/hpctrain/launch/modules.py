"""Environment-module lines for the batch script: `module` works even in a non-login batch shell."""

from __future__ import annotations

import shlex

LMOD_INIT = "/usr/share/lmod/lmod/init/bash"


def module_lines(modules: list[str], module_use: list[str] = (), var: str = "HPCTRAIN_MODULES") -> list[str]:
    """Lines that purge and load `$var` (default: the profile's modules); none when nothing to load.

    `module` is a shell function defined by a login shell; a batch script run by plain bash lacks
    it, so source Lmod's init first (DESIGN.md). A module that fails to load stops the job.
    """
    if not modules:
        return []
    lines = [
        f"{var}=${{{var}-{shlex.quote(' '.join(modules))}}}",
        f'if [ -n "${var}" ]; then',
        f"  if ! type module >/dev/null 2>&1 && [ -r {LMOD_INIT} ]; then . {LMOD_INIT}; fi",
    ]
    lines += [f"  module use {shlex.quote(p)}" for p in module_use]
    lines += ["  module purge", f"  module load ${var}  # word-split on purpose: one name per word", "fi"]
    return lines

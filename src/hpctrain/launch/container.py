"""How each task starts Python: inside `apptainer exec --nv` or bare on the host.

The script picks at run time from `$CONTAINER` (apptainer | none), so the same batch script runs
on a cluster with the image and on a test cluster without it. The host's ~/.local stays out of
the image's Python (PYTHONNOUSERSITE=1).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from hpctrain.launch.profile import ContainerSection

PY_VAR = "HPCTRAIN_PYTHON"


def bind_list(container: ContainerSection, paths: list[str]) -> list[str]:
    """Profile binds, then the job's own paths (data root, run parent) not already inside one."""
    out: list[str] = list(dict.fromkeys(container.binds))
    for p in paths:
        if p and not any(p == b or p.startswith(b.split(":")[0].rstrip("/") + "/") for b in out):
            out.append(str(Path(p)))
    return out


def python_lines(container: ContainerSection, binds: list[str], host_python: str) -> list[str]:
    """Define the bash array $HPCTRAIN_PYTHON: the command that starts Python in every task."""
    q = shlex.quote
    apptainer = ["apptainer", "exec", "--nv", "--env", "PYTHONNOUSERSITE=1"]
    for b in binds:
        apptainer += ["--bind", q(b)]
    apptainer += ['"$HPCTRAIN_IMAGE"', q(container.python)]
    return [
        f"CONTAINER=${{CONTAINER-{q(container.runtime)}}}",
        f"HPCTRAIN_IMAGE=${{HPCTRAIN_IMAGE-{q(container.image)}}}",
        'if [ "$CONTAINER" = none ]; then',
        f"  {PY_VAR}=({host_python})",
        "else",
        '  if [ ! -f "$HPCTRAIN_IMAGE" ]; then echo "hpctrain: image $HPCTRAIN_IMAGE not found '
        '(set HPCTRAIN_IMAGE, or CONTAINER=none)" >&2; exit 1; fi',
        f"  {PY_VAR}=({' '.join(apptainer)})",
        "fi",
    ]

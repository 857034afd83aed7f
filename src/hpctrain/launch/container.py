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


# Host variables a task needs inside the image (Apptainer's --cleanenv drops the rest: a module's
# PYTHONPATH, PYTHONHOME, CUDA_HOME, LD_LIBRARY_PATH must not reach the image's Python).
PASS_ENV = ("SLURM_*", "SLURMD_NODENAME", "NCCL_*", "TORCH_*", "HPCTRAIN_*", "SUBMITIT_*", "MASTER_ADDR",
            "MASTER_PORT", "GLOO_*", "UCX_*", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL",
            "PYTHONUNBUFFERED", "PYTHONFAULTHANDLER", "TMPDIR", "USER", "LANG", "LC_*", "TZ")


def cleanenv_wrapper(extra: list[str] = ()) -> str:
    """A bash program run per task, on its node, just before `apptainer exec --cleanenv`: copy the
    allowed variables into APPTAINERENV_* (which Apptainer passes even with --cleanenv). It must run
    per task: slurmstepd sets SLURM_PROCID and friends only there."""
    pats = "|".join((*PASS_ENV, *extra))
    return ('for v in $(compgen -e); do case $v in ' + pats + ') export "APPTAINERENV_$v=${!v}";; esac; done; '
            'exec "$@"')


def python_lines(container: ContainerSection, binds: list[str], host_python: str, source: str = "") -> list[str]:
    """Define the bash array $HPCTRAIN_PYTHON: the command that starts Python in every task.

    `source` (a shell word, exported as HPCTRAIN_SOURCE) is the hpctrain package the tasks run:
    the snapshot taken at submission (hpctrain.source), so that every attempt runs the code that
    submitted the job. In the image: a clean environment plus the allow-list, the job's binds, and
    `source` bound at `container.source_mount` first on PYTHONPATH; on the host (CONTAINER=none):
    `source`'s parent first on PYTHONPATH."""
    q = shlex.quote
    apptainer = ["bash", "-c", '"$hpctrain_cleanenv"', "hpctrain-task", "apptainer", "exec", "--nv", "--cleanenv"]
    for b in binds:
        apptainer += ["--bind", q(b)]
    mount = container.source_mount.rstrip("/")
    return [
        f"CONTAINER=${{CONTAINER-{q(container.runtime)}}}",
        f"HPCTRAIN_IMAGE=${{HPCTRAIN_IMAGE-{q(container.image)}}}",
        f"HPCTRAIN_SOURCE=${{HPCTRAIN_SOURCE-{source}}}",
        "export HPCTRAIN_SOURCE",
        'if [ -n "$HPCTRAIN_SOURCE" ] && [ ! -d "$HPCTRAIN_SOURCE" ]; then echo "hpctrain: HPCTRAIN_SOURCE='
        '$HPCTRAIN_SOURCE is not a directory on this node (the job\'s directory must be on a file system the '
        'nodes see; HPCTRAIN_SOURCE= runs the hpctrain that the tasks\' Python finds)" >&2; exit 1; fi',
        'if [ "$CONTAINER" = none ]; then',
        f"  {PY_VAR}=({host_python})",
        "  # the submitted hpctrain first (not the submitting shell's PYTHONPATH, which an --export=NONE",
        "  # site drops); an installed copy's site-packages is the host Python's own already",
        '  if [ -n "$HPCTRAIN_SOURCE" ]; then',
        '    if [ "$(basename "$HPCTRAIN_SOURCE")" != hpctrain ] || [[ "$(dirname "$HPCTRAIN_SOURCE")" == *:* ]]; then '
        'echo "hpctrain: HPCTRAIN_SOURCE=$HPCTRAIN_SOURCE must be a package directory named hpctrain in a path '
        'without \':\' (PYTHONPATH separates with it)" >&2; exit 1; fi',
        '    case ${HPCTRAIN_SOURCE%/*} in */site-packages|*/dist-packages) ;;',
        '      *) export PYTHONPATH="${HPCTRAIN_SOURCE%/*}${PYTHONPATH:+:$PYTHONPATH}" ;; esac',
        "  fi",
        "else",
        '  if [ ! -f "$HPCTRAIN_IMAGE" ]; then echo "hpctrain: image $HPCTRAIN_IMAGE not found '
        '(set HPCTRAIN_IMAGE, or CONTAINER=none)" >&2; exit 1; fi',
        f"  hpctrain_cleanenv={q(cleanenv_wrapper(container.pass_env))}",
        f"  {PY_VAR}=({' '.join(apptainer)})",
        "  export APPTAINERENV_PYTHONNOUSERSITE=1",
        '  if [ -n "$HPCTRAIN_SOURCE" ]; then  # the submitted hpctrain, ahead of the image\'s copy',
        f'    {PY_VAR}+=(--bind "$HPCTRAIN_SOURCE:{mount}/hpctrain:ro")',
        f"    export APPTAINERENV_PYTHONPATH={q(mount)}",
        "  fi",
        f'  {PY_VAR}+=("$HPCTRAIN_IMAGE" {q(container.python)})',
        "fi",
    ]

"""How each task starts Python: inside `apptainer exec --nv` or bare on the host.

The script picks at run time from `$CONTAINER` (apptainer | none), so the same batch script runs
on a cluster with the image and on a test cluster without it. The host's ~/.local stays out of
the image's Python (PYTHONNOUSERSITE=1).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from hpctrain.errors import LaunchError
from hpctrain.launch.profile import ContainerSection

PY_VAR = "HPCTRAIN_PYTHON"
VAR_RE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def split_bind(bind: str) -> tuple[str, str, bool]:
    """`src[:dst[:opts]]` → (src, dst, read-only); dst defaults to src (Apptainer's rule)."""
    src, dst, opts = (bind.split(":") + ["", ""])[:3]
    return src.rstrip("/") or "/", (dst or src).rstrip("/") or "/", "ro" in opts.split(",")


def under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def bind_list(container: ContainerSection, paths: list[str], writable: list[str] = ()) -> list[str]:
    """Profile binds, then a same-path bind for each of the job's own paths (data root, run dir...) the
    image would not show at that path: a task reads and writes them by their host path.

    A profile bind counts by its destination: with `/lustre/proj:/data` a path under /lustre/proj is
    not visible where the task looks (it needs its own bind); with `/datasets:/datasets:ro` a run dir
    under it is visible but read-only: a path in `writable` there is refused (LaunchError)."""
    out: list[str] = list(dict.fromkeys(container.binds))
    writes = {str(Path(w)) for w in writable if w}
    for p in paths:
        if not p:
            continue
        p = str(Path(p))
        inside = [b for b in out if under(p, split_bind(b)[1])]
        if not inside:
            out.append(p)
            continue
        b = max(inside, key=lambda b: len(split_bind(b)[1]))  # the innermost mount wins
        src, dst, ro = split_bind(b)
        if src != dst:
            raise LaunchError(
                f"{p} is hidden in the image by the bind {b!r} (it puts {src} at {dst}): the task could not "
                f"see it at its own path; bind {dst} elsewhere in container.binds, or move the path out of {dst}")
        if ro and p in writes:
            raise LaunchError(
                f"{p} is under the read-only bind {b!r}: the task could not write there; put the run "
                f"elsewhere (--set run.dir=...) or bind {dst} without :ro in container.binds")
    return out


def stage_word(stage_to: str) -> tuple[str, list[str]]:
    """`data.stage_to` as one bash word expanded on the node ($NAME, ${NAME}, a leading ~), and the
    variables it needs: the task expands it there too (data/stage.py), so the bind must match."""
    parts, names, pos = [], [], 0
    text = "$HOME" + stage_to[1:] if stage_to.startswith("~") else stage_to
    for m in VAR_RE.finditer(text):
        if m.start() > pos:
            parts.append(shlex.quote(text[pos:m.start()]))
        name = m.group(1) or m.group(2)
        parts.append(f'"${{{name}}}"')
        names.append(name)
        pos = m.end()
    if pos < len(text):
        parts.append(shlex.quote(text[pos:]))
    return "".join(parts), names


# Host variables a task needs inside the image (Apptainer's --cleanenv drops the rest: a module's
# PYTHONPATH, PYTHONHOME, CUDA_HOME, LD_LIBRARY_PATH must not reach the image's Python).
PASS_ENV = ("SLURM_*", "SLURMD_NODENAME", "NCCL_*", "TORCH_*", "HPCTRAIN_*", "SUBMITIT_*", "MASTER_ADDR",
            "MASTER_PORT", "GLOO_*", "UCX_*", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL",
            "PYTHONUNBUFFERED", "PYTHONFAULTHANDLER", "TMPDIR", "USER", "LANG", "LC_*", "TZ")


def cleanenv_wrapper(extra: list[str] = (), stage_to: str = "") -> str:
    """A bash program run per task, on its node, just before `apptainer exec --cleanenv`: copy the
    allowed variables into APPTAINERENV_* (which Apptainer passes even with --cleanenv). It must run
    per task: slurmstepd sets SLURM_PROCID and friends only there. With `stage_to` (data.stage_to,
    e.g. $TMPDIR on /localscratch) it also binds that node-local directory, expanded here with the
    node's own variables: Apptainer binds only $HOME, /tmp, /var/tmp and $PWD by default."""
    pats = "|".join((*PASS_ENV, *extra))
    stage = ""
    if stage_to:
        word, names = stage_word(stage_to)
        have = "".join(f'[ -n "${{{n}:-}}" ] && ' for n in names)
        stage = (f'{have}{{ d={word}; mkdir -p "$d" && set -- "$1" "$2" --bind "$d" "${{@:3}}"; }}; ')
    return (stage + 'for v in $(compgen -e); do case $v in ' + pats + ') export "APPTAINERENV_$v=${!v}";; esac; '
            'done; exec "$@"')


def python_lines(container: ContainerSection, binds: list[str], host_python: str, source: str = "",
                 stage_to: str = "") -> list[str]:
    """Define the bash array $HPCTRAIN_PYTHON: the command that starts Python in every task.

    `source` (a shell word, exported as HPCTRAIN_SOURCE) is the hpctrain package the tasks run:
    the snapshot taken at submission (hpctrain.source), so that every attempt runs the code that
    submitted the job. In the image: a clean environment plus the allow-list, the job's binds, and
    `source` bound at `container.source_mount` first on PYTHONPATH; on the host (CONTAINER=none):
    `source`'s parent first on PYTHONPATH. `stage_to`: data.stage_to, bound per node at run time
    (cleanenv_wrapper)."""
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
        f"  hpctrain_cleanenv={q(cleanenv_wrapper(container.pass_env, stage_to))}",
        f"  {PY_VAR}=({' '.join(apptainer)})",
        "  export APPTAINERENV_PYTHONNOUSERSITE=1",
        '  if [ -n "$HPCTRAIN_SOURCE" ]; then  # the submitted hpctrain, ahead of the image\'s copy',
        f'    {PY_VAR}+=(--bind "$HPCTRAIN_SOURCE:{mount}/hpctrain:ro")',
        f"    export APPTAINERENV_PYTHONPATH={q(mount)}",
        "  fi",
        f'  {PY_VAR}+=("$HPCTRAIN_IMAGE" {q(container.python)})',
        "fi",
    ]

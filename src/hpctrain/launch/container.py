"""How each task starts Python: in an image (Apptainer, SingularityCE, pyxis/enroot) or bare on the host.

The script picks at run time from `$CONTAINER` (apptainer | singularity | pyxis | none), so the same
batch script runs on a cluster with the image and on a test cluster without it. One function per
runtime writes its branch (docs/launch.md, "Container runtimes", has the sources):
- apptainer / singularity: `<tool> exec --nv --cleanenv` per task, the allow-listed variables passed
  as APPTAINERENV_* / SINGULARITYENV_* (SingularityCE reads only the latter);
- pyxis: no wrapper command; srun itself starts the task in the image from the options in the array
  $HPCTRAIN_SRUN_CONTAINER (--container-image, --container-mounts, --container-workdir), which the
  srun line expands; the allow-list is applied inside the image, against its /etc/environment.
The host's ~/.local stays out of the image's Python (PYTHONNOUSERSITE=1).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from hpctrain.errors import LaunchError
from hpctrain.launch import shellfile
from hpctrain.site.profile import ContainerSection

PY_VAR = "HPCTRAIN_PYTHON"
SRUN_VAR = "HPCTRAIN_SRUN_CONTAINER"  # srun options that start each task in the image (pyxis); empty otherwise
RUNTIMES = ("apptainer", "singularity", "pyxis", "none")
# the variables each Singularity flavour turns into X inside, even with --cleanenv; SingularityCE
# ignores APPTAINERENV_* (apptainer-userdocs, singularity_compatibility: only Apptainer reads both)
ENV_PREFIX = {"apptainer": "APPTAINERENV_", "singularity": "SINGULARITYENV_"}
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
                f"see it at its own path; bind {dst} elsewhere in container.binds, or move the path out of {dst}"
            )
        if ro and p in writes:
            raise LaunchError(
                f"{p} is under the read-only bind {b!r}: the task could not write there; put the run "
                f"elsewhere (--set run.dir=...) or bind {dst} without :ro in container.binds"
            )
    return out


def stage_word(stage_to: str) -> tuple[str, list[str]]:
    """`data.stage_to` as one bash word expanded on the node ($NAME, ${NAME}, a leading ~), and the
    variables it needs: the task expands it there too (data/stage.py), so the bind must match."""
    parts, names, pos = [], [], 0
    text = "$HOME" + stage_to[1:] if stage_to.startswith("~") else stage_to
    for m in VAR_RE.finditer(text):
        if m.start() > pos:
            parts.append(shlex.quote(text[pos : m.start()]))
        name = m.group(1) or m.group(2)
        parts.append(f'"${{{name}}}"')
        names.append(name)
        pos = m.end()
    if pos < len(text):
        parts.append(shlex.quote(text[pos:]))
    return "".join(parts), names


# Host variables a task needs inside the image (Apptainer's --cleanenv drops the rest: a module's
# PYTHONPATH, PYTHONHOME, CUDA_HOME, LD_LIBRARY_PATH must not reach the image's Python).
PASS_ENV = (
    "SLURM_*",
    "SLURMD_NODENAME",
    "NCCL_*",
    "TORCH_*",
    "HPCTRAIN_*",
    "SUBMITIT_*",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GLOO_*",
    "UCX_*",
    "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "PYTHONUNBUFFERED",
    "PYTHONFAULTHANDLER",
    "PYTHONDONTWRITEBYTECODE",  # the batch shell's: no task writes __pycache__ into the code snapshot (source.sh)
    "TMPDIR",
    "USER",
    "LANG",
    "LC_*",
    "TZ",
)


def image_dir_line(stage_image_to: str) -> str:
    """A value of a per-node program: $hpctrain_image_dir, where container.stage_image keeps that
    node's copy of $HPCTRAIN_IMAGE (`stage_image_to` expanded there, like data.stage_to);
    shell/local_image.sh names the copy in it, so the copier and each task agree on it."""
    return f"hpctrain_image_dir={stage_word(stage_image_to)[0]}"


def cleanenv_wrapper(
    extra: list[str] = (), stage_to: str = "", prefix: str = "APPTAINERENV_", stage_image_to: str = ""
) -> str:
    """A bash program run per task, on its node, just before `apptainer|singularity exec --cleanenv`:
    copy the allowed variables into `prefix`* (APPTAINERENV_ or SINGULARITYENV_, passed even with
    --cleanenv; shell/cleanenv.sh). It must run per task: slurmstepd sets SLURM_PROCID and friends
    only there. With `stage_to` (data.stage_to, e.g. $TMPDIR on /localscratch) it also binds that
    node-local directory, expanded there with the node's own variables (shell/stage_bind.sh). With
    `stage_image_to` (container.stage_image) the image argument becomes the node's local copy
    (shell/image_swap.sh)."""
    values = [shellfile.assign("hpctrain_prefix", prefix), shellfile.array("hpctrain_pass", [*PASS_ENV, *extra])]
    files = []
    if stage_to:
        word, names = stage_word(stage_to)
        values += [f"hpctrain_stage_dir={word}", shellfile.array("hpctrain_stage_dir_needs", names)]
        files.append("stage_bind.sh")
    if stage_image_to:
        values.append(image_dir_line(stage_image_to))
        files += ["local_image.sh", "image_swap.sh"]
    return shellfile.program([*files, "cleanenv.sh"], values)


def image_env_wrapper(extra: list[str], mount: str) -> str:
    """A bash program run per task inside a pyxis/enroot image, before Python (shell/image_env.sh):
    keep the image's own variables (/etc/environment) and the allow-list, drop the rest of the host
    environment that pyxis passed in (a module's PYTHONPATH, CUDA_HOME...): the same environment as
    `--cleanenv` plus APPTAINERENV_* gives. $HPCTRAIN_SOURCE set: the submitted hpctrain, mounted at
    `mount`/hpctrain, first on PYTHONPATH."""
    pats = [*PASS_ENV, *extra, "PATH", "HOME", "PWD", "SHLVL", "TERM", "HOSTNAME"]
    return shellfile.program(
        ["image_env.sh"], [shellfile.array("hpctrain_pass", pats), shellfile.assign("hpctrain_mount", mount)]
    )


def none_lines(host_python: str) -> list[str]:
    """CONTAINER=none: the host's Python, the submitted hpctrain first on PYTHONPATH (shell/none.sh)."""
    return [f"  {PY_VAR}=({host_python})", *shellfile.lines("none.sh", "  ")]


def singularity_family_lines(tool: str, container: ContainerSection, binds: list[str], stage_to: str) -> list[str]:
    """`<tool> exec --nv --cleanenv --bind ... IMAGE python` behind the per-task env wrapper; `tool`
    is apptainer or singularity, which differ only in the command and its ENV prefix."""
    q, prefix = shlex.quote, ENV_PREFIX[tool]
    cmd = ["bash", "-c", '"$hpctrain_cleanenv"', "hpctrain-task", tool, "exec", "--nv", "--cleanenv"]
    for b in binds:
        cmd += ["--bind", shellfile.word(b)]
    mount = container.source_mount.rstrip("/")
    local = container.stage_image_to if container.stage_image else ""
    return [
        *shellfile.lines("sif.sh", "  "),
        *(["  export HPCTRAIN_IMAGE  # each task finds its node's staged copy by it"] if local else []),
        "  "
        + shellfile.assign_program("hpctrain_cleanenv", cleanenv_wrapper(container.pass_env, stage_to, prefix, local)),
        f"  {PY_VAR}=({' '.join(cmd)})",
        f"  export {prefix}PYTHONNOUSERSITE=1",
        '  if [ -n "$HPCTRAIN_SOURCE" ]; then  # the submitted hpctrain, ahead of the image\'s copy',
        f'    {PY_VAR}+=(--bind "$HPCTRAIN_SOURCE:{mount}/hpctrain:ro")',
        f"    export {prefix}PYTHONPATH={q(mount)}",
        "  fi",
        f'  {PY_VAR}+=("$HPCTRAIN_IMAGE" {q(container.python)})',
    ]


def apptainer_lines(container: ContainerSection, binds: list[str], stage_to: str = "") -> list[str]:
    """Apptainer: `apptainer exec`, APPTAINERENV_* (it also reads SINGULARITYENV_*)."""
    return singularity_family_lines("apptainer", container, binds, stage_to)


def singularity_lines(container: ContainerSection, binds: list[str], stage_to: str = "") -> list[str]:
    """SingularityCE (Sylabs): `singularity exec`, SINGULARITYENV_*; it has no `apptainer` command and
    ignores APPTAINERENV_*. On an Apptainer site `singularity` is a link to apptainer, which reads both."""
    return singularity_family_lines("singularity", container, binds, stage_to)


def pyxis_mount(bind: str) -> str:
    """A bind (src[:dst[:opts]]) as a --container-mounts entry SRC:DST[:ro]; pyxis separates entries
    with ',' and mount flags with '+', so a path with ',' cannot be given (LaunchError)."""
    src, dst, ro = split_bind(bind)
    if "," in src or "," in dst:
        raise LaunchError(
            f"bind {bind!r} holds ',', which separates pyxis's --container-mounts entries: "
            "move the path, or use container.runtime apptainer"
        )
    return f"{src}:{dst}" + (":ro" if ro else "")


def check_pyxis(binds: list[str], stage_to: str = "") -> None:
    """What pyxis cannot do here (LaunchError): a bind with ',' or a data.stage_to (its node-local
    directory would have to exist on every node before srun; Apptainer's wrapper makes it per task)."""
    for b in binds:
        pyxis_mount(b)
    if stage_to:
        raise LaunchError(
            f"data.stage_to={stage_to!r} is not supported with container.runtime pyxis yet: "
            "leave data.stage_to empty, or use container.runtime apptainer or singularity"
        )


def pyxis_lines(container: ContainerSection, binds: list[str], stage_to: str = "") -> list[str]:
    """pyxis/enroot: srun starts each task in the image ($HPCTRAIN_SRUN_CONTAINER on the srun line);
    the mounts are the job's binds, the job's directory (the tasks' working directory, which
    Apptainer binds itself) and the submitted hpctrain; no GPU flag (enroot's hooks add the GPUs).
    container.stage_image: --container-name, one per job attempt and image (shell/pyxis_name.sh), so
    each node unpacks the image for the attempt's first step only and later steps (a spare's restart,
    eval) reuse it (pyxis: "the import is skipped"); stage_image.pyxis_clean_lines removes them."""
    q = shlex.quote
    mount = container.source_mount.rstrip("/")
    try:
        check_pyxis(binds, stage_to)
        mounts = ",".join(pyxis_mount(b) for b in binds)
    except LaunchError as e:  # written for another runtime: this branch refuses, the others run
        return [f"  echo {q(f'hpctrain: {e}')} >&2; exit 1"]
    return [
        *shellfile.lines("pyxis.sh", "  "),
        f"  hpctrain_mounts={q(mounts)}",
        '  hpctrain_mounts+="${hpctrain_mounts:+,}$PWD"',
        f'  if [ -n "$HPCTRAIN_SOURCE" ]; then hpctrain_mounts+=",$HPCTRAIN_SOURCE:{mount}/hpctrain:ro"; fi',
        f'  {SRUN_VAR}=(--container-image="$HPCTRAIN_IMAGE" --container-mounts="$hpctrain_mounts" '
        '--container-workdir="$PWD")',
        *(
            [
                *shellfile.lines("pyxis_name.sh", "  "),
                f'  {SRUN_VAR}+=(--container-name="$hpctrain_pyxis_name")  # unpacked once per node and attempt',
            ]
            if container.stage_image
            else []
        ),
        "  " + shellfile.assign_program("hpctrain_imageenv", image_env_wrapper(container.pass_env, mount)),
        f'  {PY_VAR}=(bash -c "$hpctrain_imageenv" hpctrain-task {q(container.python)})',
    ]


# nsys profile's options (Nsight Systems user guide, "CLI Profile Command Switch Options"; docs/profiling.md):
# record only between the task's cudaProfilerStart and cudaProfilerStop (train.observe.profiling, around
# log.profile_steps), keep the application running after the stop, overwrite a report a requeued
# attempt left behind.
NSYS_ARGS = (
    "profile",
    "--capture-range=cudaProfilerApi",
    "--capture-range-end=stop",
    "--trace=cuda,nvtx,osrt",
    "--force-overwrite=true",
)


def nsys_wrapper(ranks: list[int], out_dir: str) -> str:
    """A bash program run per task in the image, just before Python (shell/nsys.sh): the tasks whose
    global rank is in `ranks` exec the image's `nsys profile ... -o <out_dir>/nsys-rank-<r> python ...`
    (HPCTRAIN_NSYS=1 tells the loop; torch.profiler stays off there, nsys owns CUPTI), the others
    exec Python as is."""
    return shellfile.program(
        ["nsys.sh"],
        [
            shellfile.array("hpctrain_ranks", [int(r) for r in ranks]),
            shellfile.assign("hpctrain_nsys_dir", out_dir),
            shellfile.array("hpctrain_nsys_args", list(NSYS_ARGS)),
        ],
    )


def nsys_lines(ranks: list[int], out_dir: str) -> list[str]:
    """Wrap the last word of $HPCTRAIN_PYTHON (the Python inside the image, or the host's) in nsys_wrapper;
    nothing without `ranks`."""
    if not ranks:
        return []
    return [shellfile.assign_program("hpctrain_nsys", nsys_wrapper(ranks, out_dir)), *shellfile.lines("nsys_wrap.sh")]


def python_lines(
    container: ContainerSection,
    binds: list[str],
    host_python: str,
    source: str = "",
    stage_to: str = "",
    nsys_ranks: list[int] = (),
    nsys_dir: str = "",
    env_hooks: bool = False,
) -> list[str]:
    """Define the bash arrays $HPCTRAIN_PYTHON (the command that starts Python in every task) and
    $HPCTRAIN_SRUN_CONTAINER (srun options that put the task in the image: pyxis only).

    `source` (a shell word, exported as HPCTRAIN_SOURCE) is the hpctrain package the tasks run:
    the snapshot taken at submission (hpctrain.run.source), so that every attempt runs the code that
    submitted the job. In the image: a clean environment plus the allow-list, the job's binds, and
    `source` mounted at `container.source_mount` first on PYTHONPATH; on the host (CONTAINER=none):
    `source`'s parent first on PYTHONPATH. `stage_to`: data.stage_to, bound per node at run time
    (cleanenv_wrapper). Every runtime's branch is written, so the stand-alone script's CONTAINER= can switch.
    `nsys_ranks`: those tasks run under nsys, reports in `nsys_dir` (nsys_lines).
    `env_hooks` (the stand-alone `slurm/vit.sbatch` only): CONTAINER, HPCTRAIN_IMAGE and HPCTRAIN_SOURCE
    already in the job's environment win; otherwise (a script hpctrain submits) the values are fixed at
    submission, so that a variable the user once exported cannot swap the code or image of the job."""
    q = shlex.quote
    values = {"CONTAINER": q(container.runtime), "HPCTRAIN_IMAGE": q(container.image), "HPCTRAIN_SOURCE": source}
    return [
        *(f"{k}=${{{k}-{v}}}" if env_hooks else f"{k}={v}" for k, v in values.items()),
        *shellfile.lines("source.sh"),
        f"{SRUN_VAR}=()",
        *image_identity_lines(),
        "case $CONTAINER in",
        "none)",
        *none_lines(host_python),
        "  ;;",
        "apptainer)",
        *apptainer_lines(container, binds, stage_to),
        "  ;;",
        "singularity)",
        *singularity_lines(container, binds, stage_to),
        "  ;;",
        "pyxis)",
        *pyxis_lines(container, binds, stage_to),
        "  ;;",
        f'*) echo "hpctrain: CONTAINER=$CONTAINER is not one of {", ".join(RUNTIMES)}" >&2; exit 1 ;;',
        "esac",
        *nsys_lines(list(nsys_ranks), nsys_dir),
    ]


def image_identity_lines() -> list[str]:
    """hpctrain_image_cksum (the image's stat checksum; pyxis_name.sh names the container by it), and
    $HPCTRAIN_IMAGE_DIGEST (compile.cache's key) unless the site set it (shell/image_identity.sh)."""
    return shellfile.lines("image_identity.sh")


def task_words(
    container: ContainerSection,
    binds: list[str],
    host_python: str,
    source: str = "",
    workdir: str = "$PWD",
    nsys: bool = False,
) -> tuple[list[str], list[str]]:
    """($HPCTRAIN_SRUN_CONTAINER, $HPCTRAIN_PYTHON) as python_lines' branch of `container.runtime` sets
    them in a script whose runtime, image and `source` (a path, "" for none) are fixed at submission,
    as shell words with the values filled in: the step command the short dry run shows. The per-task
    programs stay named ("$hpctrain_cleanenv"); `workdir`: the batch shell's $PWD (pyxis mounts it).
    tests/launch/test_dryrun.py runs the rendered branch in bash and compares."""
    q, mount = shlex.quote, container.source_mount.rstrip("/")
    own = [f"{source}:{mount}/hpctrain:ro"] if source else []
    srun: list[str] = []
    if container.runtime == "none":
        python = [host_python]
    elif container.runtime == "pyxis":
        mounts = ",".join([*(pyxis_mount(b) for b in binds), workdir, *own])
        srun = [f"--container-image={q(container.image)}", f"--container-mounts={q(mounts)}"]
        srun.append(f"--container-workdir={q(workdir)}")
        if container.stage_image:
            srun.append('--container-name="$hpctrain_pyxis_name"')
        python = ["bash", "-c", '"$hpctrain_imageenv"', "hpctrain-task", q(container.python)]
    else:
        tool = container.runtime
        python = ["bash", "-c", '"$hpctrain_cleanenv"', "hpctrain-task", tool, "exec", "--nv", "--cleanenv"]
        for b in [*binds, *own]:
            python += ["--bind", shellfile.word(b)]
        python += [q(container.image), q(container.python)]
    if nsys:
        python[-1:] = ["bash", "-c", '"$hpctrain_nsys"', "hpctrain-nsys", python[-1]]
    return srun, python


def task_env(container: ContainerSection, source: str = "") -> tuple[str, list[str]]:
    """Where the runtime's branch sets the task's own Python variables, and them (NAME=value): the
    host's ~/.local out, the submitted hpctrain (`source`, a path) first on PYTHONPATH."""
    mount = container.source_mount.rstrip("/")
    if container.runtime == "none":
        parent = source.rsplit("/", 1)[0]
        if not source or parent.endswith(("/site-packages", "/dist-packages")):
            return "exported by the batch shell", []
        return "exported by the batch shell", [f"PYTHONPATH={shlex.quote(parent)}${{PYTHONPATH:+:$PYTHONPATH}}"]
    own = [f"PYTHONPATH={shlex.quote(mount)}"] if source else []
    if container.runtime == "pyxis":
        return "set in the image by image_env.sh", ["PYTHONNOUSERSITE=1", *own]
    prefix = ENV_PREFIX[container.runtime]
    return f"exported by the batch shell as {prefix}*", [f"{prefix}{v}" for v in ["PYTHONNOUSERSITE=1", *own]]

"""How each task starts Python: in an image or bare on the host, whichever runtime the script picks.

The script picks at run time from `$CONTAINER` (one of site.runtimes.REGISTRY: apptainer, singularity,
pyxis, none), so the same batch script runs on a cluster with the image and on a test cluster without
it. Each runtime writes its own branch (site/runtimes/); this module puts them together, adds the
job's binds (the paths a task must see at their own path) and wraps the chosen ranks in nsys.
The host's ~/.local stays out of the image's Python (PYTHONNOUSERSITE=1).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from hpctrain import shellfile
from hpctrain.errors import LaunchError
from hpctrain.site import runtimes
from hpctrain.site.profile import ContainerSection
from hpctrain.site.runtimes.base import SRUN_VAR, split_bind


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
        *(shellfile.default_word(k, v) if env_hooks else f"{k}={v}" for k, v in values.items()),
        *shellfile.lines("source.sh"),
        f"{SRUN_VAR}=()",
        *image_identity_lines(),
        *(
            line
            for r in runtimes.REGISTRY.values()
            for line in shellfile.function(
                f"hpctrain_runtime_{r.name}", r.branch(container, binds, host_python, stage_to)
            )
        ),
        shellfile.assign("hpctrain_runtimes", ", ".join(runtimes.REGISTRY)),
        *shellfile.lines("runtime.sh"),
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
    mount = container.source_mount.rstrip("/")
    own = [f"{source}:{mount}/hpctrain:ro"] if source else []
    srun, python = runtimes.get(container.runtime).task_words(container, binds, host_python, own, workdir)
    if nsys:
        python[-1:] = ["bash", "-c", '"$hpctrain_nsys"', "hpctrain-nsys", python[-1]]
    return srun, python


def task_env(container: ContainerSection, source: str = "") -> tuple[str, list[str]]:
    """Where the runtime's branch sets the task's own Python variables, and them (NAME=value): the
    host's ~/.local out, the submitted hpctrain (`source`, a path) first on PYTHONPATH."""
    return runtimes.get(container.runtime).task_env(container, source)

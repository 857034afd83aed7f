"""What a container runtime is to hpctrain: the `Runtime` protocol every runtime module implements,
and what the runtimes share (the task's allow-list, binds, the node-local words, the probe for a tool).

A runtime is one module of this package (apptainer, singularity, pyxis, none) holding one object
that says how it is found on a node, what the batch shell's branch for it is (the command that starts
Python in every task), the same command as words for the dry run, the notebook's command, the cluster
probe's command, and what it cannot do. The registry (`site/runtimes/__init__.py`) lists them; the
profile's choices, `cluster init`, `doctor` and the batch shell's renderers read only the registry
(docs/runtimes.md, "Adding a runtime"). No torch: this runs on login nodes.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass
from typing import Protocol

from hpctrain import shellfile

PY_VAR = "HPCTRAIN_PYTHON"  # the bash array: the command that starts Python in every task
SRUN_VAR = "HPCTRAIN_SRUN_CONTAINER"  # srun options that start each task in the image (pyxis); empty otherwise

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


@dataclass(frozen=True)
class Found:
    """One runtime found on this node."""

    runtime: str  # the runtime's name (container.runtime's value)
    evidence: str  # the command and the line that showed it, for the profile's comment
    module: str = ""  # the module that provides it ("" when it is on PATH already)


class Container(Protocol):
    """The profile's `container:` section as a runtime reads it (site.profile.ContainerSection)."""

    @property
    def runtime(self) -> str: ...

    @property
    def image(self) -> str: ...

    @property
    def python(self) -> str: ...

    @property
    def source_mount(self) -> str: ...

    @property
    def pass_env(self) -> list[str]: ...

    @property
    def stage_image(self) -> bool: ...

    @property
    def stage_image_to(self) -> str: ...

    @property
    def stage_image_keep_days(self) -> int: ...


class Runtime(Protocol):
    """A container runtime: one module of this package, one object, registered by name."""

    name: str  # container.runtime's value
    help: str  # what it is, in a few words (the profile's doc and --runtime's help)
    image_kind: str  # the images it runs: "sif", "enroot", or "" (none: the host's Python)
    module_stem: str  # the Lmod module name that provides it ("apptainer"), "" when no module does
    command: str  # the program that starts each task in the image, on PATH ("" when srun does: pyxis)
    not_found_hint: str  # what to do when doctor does not find it on a node

    def claims(self, image: str) -> bool:
        """`image` (a path or URI) is in this runtime's own format, known by its name (.sif, .sqsh)."""
        ...

    def detect(self, shell_prefix: str = "", module: str = "") -> Found | None:
        """This runtime on this node (after `shell_prefix`, e.g. a module load, in bash); None if absent."""
        ...

    def check(self, binds: list[str], stage_to: str = "") -> None:
        """Refuse (LaunchError) what it cannot do with these binds and data.stage_to."""
        ...

    def branch(self, c: Container, binds: list[str], host_python: str, stage_to: str = "") -> list[str]:
        """The body of its function in the batch script (hpctrain_runtime_<name>, called when $CONTAINER
        names it: shell/runtime.sh): set $HPCTRAIN_PYTHON (and $HPCTRAIN_SRUN_CONTAINER); values through
        shellfile, the bash in files."""
        ...

    def stage(self, c: Container) -> list[str]:
        """The batch shell's lines that stage the image on the job's nodes before the training step
        (container.stage_image; launch/stage_image.py); [] when it stages nothing."""
        ...

    def task_words(
        self, c: Container, binds: list[str], host_python: str, own: list[str], workdir: str
    ) -> tuple[list[str], list[str]]:
        """(srun options, Python's command) as the branch sets them, as shell words (the dry run);
        `own`: the bind of the submitted hpctrain ([] for none); `workdir`: the batch shell's $PWD."""
        ...

    def task_env(self, c: Container, source: str) -> tuple[str, list[str]]:
        """Where the branch sets the task's own Python variables, and them (NAME=value)."""
        ...

    def notebook(self, image: str, workdir: str, cpus: int, jupyter: list[str]) -> str:
        """The command that starts Jupyter in `image` (launch/notebook.py)."""
        ...

    def probe(self, image: str, package: str, mount: str, python: str) -> list[str]:
        """The words after srun's options that run `python3 -m hpctrain doctor --json` in `image`
        (cluster init --probe), with `package` (this hpctrain) bound at `mount`; `python`: the
        login node's own, where there is no image."""
        ...


def split_bind(bind: str) -> tuple[str, str, bool]:
    """`src[:dst[:opts]]` → (src, dst, read-only); dst defaults to src (Apptainer's rule)."""
    src, dst, opts = (bind.split(":") + ["", ""])[:3]
    return src.rstrip("/") or "/", (dst or src).rstrip("/") or "/", "ro" in opts.split(",")


def image_dir_line(stage_image_to: str) -> str:
    """A value of a per-node program: $hpctrain_image_dir, where container.stage_image keeps that
    node's copy of $HPCTRAIN_IMAGE (`stage_image_to` expanded there, like data.stage_to);
    shell/local_image.sh names the copy in it, so the copier and each task agree on it."""
    return f"hpctrain_image_dir={shellfile.node_word(stage_image_to)[0]}"


def output(cmd: list[str], shell_prefix: str = "", timeout: float = 30) -> str | None:
    """stdout+stderr of `cmd` (after `shell_prefix`, e.g. a module load, in bash); None if it fails."""
    if not shell_prefix and not shutil.which(cmd[0]):
        return None
    argv = ["bash", "-c", f"{shell_prefix} && {shlex.join(cmd)}"] if shell_prefix else cmd
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout + r.stderr if r.returncode == 0 else None

"""pyxis/enroot: NVIDIA's SPANK plugin starts each task of an srun step in an image
(`srun --container-image=…`): no wrapper command, the image is an enroot squashfs or a registry URI.

pyxis is told apart by srun listing its options (`srun --help` shows `--container-image`).
--container-mounts separates entries with ',' and mount flags with '+', so a path holding ',' cannot
be mounted; the allow-list is applied inside the image against its /etc/environment
(shell/image_env.sh), the same environment `--cleanenv` plus APPTAINERENV_* gives.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from hpctrain import shellfile
from hpctrain.errors import LaunchError
from hpctrain.site.runtimes.base import PASS_ENV, Container, Found, output, split_bind


def mount(bind: str) -> str:
    """A bind (src[:dst[:opts]]) as a --container-mounts entry SRC:DST[:ro]; a path with ',' cannot be
    given (LaunchError)."""
    src, dst, ro = split_bind(bind)
    if "," in src or "," in dst:
        raise LaunchError(
            f"bind {bind!r} holds ',', which pyxis's --container-mounts cannot take (it separates "
            "entries with it): move the path, or use container.runtime apptainer"
        )
    return f"{src}:{dst}" + (":ro" if ro else "")


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


def clean_lines() -> list[str]:
    """Remove this job's named containers on its nodes (shell/pyxis_clean.sh runs shell/pyxis_remove.sh
    on each) at a requeued attempt's start and as the batch shell ends: pyxis keeps a named container."""
    return [
        shellfile.assign_program("hpctrain_pyxis_remove", shellfile.program(["pyxis_remove.sh"])),
        *shellfile.lines("pyxis_clean.sh"),
    ]


@dataclass(frozen=True)
class Pyxis:
    """srun starts each task in the image ($HPCTRAIN_SRUN_CONTAINER on the srun line)."""

    name: str = "pyxis"
    help: str = "srun --container-image, enroot"
    image_kind: str = "enroot"
    module_stem: str = ""  # a SPANK plugin of the site's Slurm: no module provides it
    command: str = ""  # srun starts each task in the image
    not_found_hint: str = "pyxis is an srun plugin: check `srun --help | grep container-image` on a node of the cluster"

    def claims(self, image: str) -> bool:
        """A squashfs from `enroot import`, or a registry URI such as nvcr.io#nvidia/pytorch:23.12-py3."""
        return image.endswith((".sqsh", ".squashfs")) or "#" in image or "://" in image

    def detect(self, shell_prefix: str = "", module: str = "") -> Found | None:
        text = output(["srun", "--help"], shell_prefix)
        if text and "--container-image" in text:
            return Found(self.name, "srun --help lists --container-image (the pyxis SPANK plugin)")
        return None

    def check(self, binds: list[str], stage_to: str = "") -> None:
        """A bind with ',', or a data.stage_to (its node-local directory would have to exist on every
        node before srun; Apptainer's wrapper makes it per task)."""
        for b in binds:
            mount(b)
        if stage_to:
            raise LaunchError(
                f"data.stage_to={stage_to!r} is not supported with container.runtime pyxis yet: "
                "leave data.stage_to empty, or use container.runtime apptainer or singularity"
            )

    def branch(self, c: Container, binds: list[str], host_python: str, stage_to: str = "") -> list[str]:
        """The mounts are the job's binds, the job's directory (the tasks' working directory, which
        Apptainer binds itself) and the submitted hpctrain; no GPU flag (enroot's hooks add the GPUs).
        container.stage_image: --container-name, one per job attempt and image (shell/pyxis_name.sh), so
        each node unpacks the image for the attempt's first step only and later steps (a spare's restart,
        eval) reuse it (pyxis: "the import is skipped"); clean_lines removes them."""
        m = c.source_mount.rstrip("/")
        try:
            self.check(binds, stage_to)
            mounts = ",".join(mount(b) for b in binds)
        except LaunchError as e:  # written for another runtime: this branch refuses, the others run
            return [shellfile.assign("hpctrain_refused", str(e)), *shellfile.lines("refused.sh")]
        return [
            shellfile.assign("hpctrain_mounts", mounts),
            shellfile.assign("hpctrain_mount", m),
            shellfile.assign("hpctrain_image_python", c.python),
            shellfile.assign_program("hpctrain_imageenv", image_env_wrapper(c.pass_env, m)),
            *shellfile.lines("pyxis.sh"),
            *(shellfile.lines("pyxis_name.sh") if c.stage_image else []),
        ]

    def stage(self, c: Container) -> list[str]:
        """Nothing to copy: the --container-name of the branch unpacks the image once per node and
        attempt; the batch shell removes those containers (clean_lines)."""
        return clean_lines() if c.stage_image else []

    def task_words(
        self, c: Container, binds: list[str], host_python: str, own: list[str], workdir: str
    ) -> tuple[list[str], list[str]]:
        q = shlex.quote
        mounts = ",".join([*(mount(b) for b in binds), workdir, *own])
        srun = [f"--container-image={q(c.image)}", f"--container-mounts={q(mounts)}"]
        srun.append(f"--container-workdir={q(workdir)}")
        if c.stage_image:
            srun.append('--container-name="$hpctrain_pyxis_name"')
        return srun, ["bash", "-c", '"$hpctrain_imageenv"', "hpctrain-task", q(c.python)]

    def task_env(self, c: Container, source: str) -> tuple[str, list[str]]:
        own = [f"PYTHONPATH={shlex.quote(c.source_mount.rstrip('/'))}"] if source else []
        return "set in the image by image_env.sh", ["PYTHONNOUSERSITE=1", *own]

    def notebook(self, image: str, workdir: str, cpus: int, jupyter: list[str]) -> str:
        """A step of one task in the image, the notebook directory mounted at its own path and the
        working directory, with the job's CPUs (srun 23.11+ does not take --cpus-per-task from the
        job); pyxis hands the step the exported JUPYTER_TOKEN (an image's own value would win, and
        images do not set it)."""
        q = shlex.quote
        return (
            f"srun --nodes=1 --ntasks=1 --cpus-per-task={cpus} --container-image={q(image)} "
            f"--container-mounts={q(mount(workdir))} --container-workdir={q(workdir)} "
            f"{shlex.join(jupyter)}"
        )

    def probe(self, image: str, package: str, mount: str, python: str) -> list[str]:
        m = mount.rstrip("/")
        return [
            f"--container-image={image}",
            f"--container-mounts={package}:{m}/hpctrain:ro",
            "env",
            f"PYTHONPATH={m}",
            *("python3", "-m", "hpctrain", "doctor", "--json"),
        ]


RUNTIME = Pyxis()

"""The SIF family: Apptainer and SingularityCE run a .sif with `<tool> exec --nv --cleanenv` per task.

They differ in the command, in the variables they turn into X inside the image even with --cleanenv
(Apptainer reads APPTAINERENV_* and SINGULARITYENV_*, SingularityCE only the latter:
apptainer-userdocs, singularity_compatibility) and in what `--version` prints (docs/launch.md,
"Container runtimes"): `apptainer --version` → "apptainer version 1.3.4"; `singularity --version` →
"apptainer version …" on an Apptainer site (it installs `singularity` as a link to itself) or
"singularity-ce version 4.1.0" for SingularityCE, which has no `apptainer`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from hpctrain import shellfile
from hpctrain.site.runtimes.base import PASS_ENV, Container, Found, image_dir_line, output


def flavour(version_text: str) -> str | None:
    """`singularity --version` (or `apptainer --version`) → apptainer | singularity; None if neither."""
    first = (version_text.strip().splitlines() or [""])[0].lower()
    if first.startswith("apptainer"):
        return "apptainer"  # Apptainer's own binary, called as apptainer or through its singularity link
    if re.match(r"singularity(-ce)?\b", first) or "singularityce" in first:
        return "singularity"  # SingularityCE (or Singularity 3.x before the split: SINGULARITYENV_ too)
    return None


def cleanenv_wrapper(
    extra: Sequence[str] = (), stage_to: str = "", prefix: str = "APPTAINERENV_", stage_image_to: str = ""
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
        word, names = shellfile.node_word(stage_to)
        values += [f"hpctrain_stage_dir={word}", shellfile.array("hpctrain_stage_dir_needs", names)]
        files.append("stage_bind.sh")
    if stage_image_to:
        values.append(image_dir_line(stage_image_to))
        files += ["local_image.sh", "image_swap.sh"]
    return shellfile.program([*files, "cleanenv.sh"], values)


def copy_program(stage_image_to: str, keep_days: int = 7) -> str:
    """The copier of container.stage_image (shell/stage_copy.sh; launch/stage_image.py says why), a
    bash program run once on each node with $HPCTRAIN_IMAGE set."""
    needs = shellfile.array(
        "hpctrain_image_dir_needs", shellfile.node_word(stage_image_to)[1]
    )  # checked before the copy
    keep = f"hpctrain_keep_days={int(keep_days)}"
    return shellfile.program(["local_image.sh", "stage_copy.sh"], [image_dir_line(stage_image_to), needs, keep])


@dataclass(frozen=True)
class SifRuntime:
    """Apptainer or SingularityCE: `tool exec --nv --cleanenv --bind … IMAGE python` per task."""

    name: str  # the command, and container.runtime's value
    env_prefix: str  # what it turns into variables inside the image under --cleanenv
    help: str
    not_found_hint: str = ""
    image_kind: str = "sif"

    @property
    def module_stem(self) -> str:
        return self.name

    @property
    def command(self) -> str:
        return self.name

    def claims(self, image: str) -> bool:
        return image.endswith(".sif")

    def detect(self, shell_prefix: str = "", module: str = "") -> Found | None:
        """`apptainer --version`, then `singularity --version` (a module: its own command only), the
        first that says it is this runtime."""
        for tool in (module.split("/")[0],) if module else ("apptainer", "singularity"):
            text = output([tool, "--version"], shell_prefix)
            if text and flavour(text) == self.name:
                how = f"{tool} --version: {text.strip().splitlines()[0]}"
                return Found(self.name, how + (f" (module {module})" if module else ""), module)
        return None

    def check(self, binds: list[str], stage_to: str = "") -> None:
        """Any bind and data.stage_to: the per-task wrapper binds the node-local directory."""

    def branch(self, c: Container, binds: list[str], host_python: str, stage_to: str = "") -> list[str]:
        """`<tool> exec --nv --cleanenv --bind ... IMAGE python` behind the per-task env wrapper (shell/sif.sh)."""
        local = c.stage_image_to if c.stage_image else ""
        wrapper = cleanenv_wrapper(c.pass_env, stage_to, self.env_prefix, local)
        return [
            shellfile.array("hpctrain_exec", self.exec_words(binds), width=10**6),  # one line: the command as run
            shellfile.assign("hpctrain_prefix", self.env_prefix),
            shellfile.assign("hpctrain_mount", c.source_mount.rstrip("/")),
            shellfile.assign("hpctrain_image_python", c.python),
            shellfile.assign("hpctrain_staged", "1" if local else ""),
            shellfile.assign_program("hpctrain_cleanenv", wrapper),
            *shellfile.lines("sif.sh"),
        ]

    def stage(self, c: Container) -> list[str]:
        """One step of one task per node copies the SIF to node-local disk (shell/stage_step.sh)."""
        if not c.stage_image:
            return []
        prog = copy_program(c.stage_image_to, c.stage_image_keep_days)
        return [shellfile.assign_program("hpctrain_stage_image", prog), *shellfile.lines("stage_step.sh")]

    def exec_words(self, binds: list[str]) -> list[str]:
        """`<tool> exec --nv --cleanenv --bind B ...`: the command before the image and its Python."""
        return [self.name, "exec", "--nv", "--cleanenv", *(w for b in binds for w in ("--bind", b))]

    def task_words(
        self, c: Container, binds: list[str], host_python: str, own: list[str], workdir: str
    ) -> tuple[list[str], list[str]]:
        words = [shellfile.word(w) for w in self.exec_words([*binds, *own])]
        return [], [
            "bash",
            "-c",
            '"$hpctrain_cleanenv"',
            "hpctrain-task",
            *words,
            shlex.quote(c.image),
            shlex.quote(c.python),
        ]

    def task_env(self, c: Container, source: str) -> tuple[str, list[str]]:
        own = [f"PYTHONPATH={shlex.quote(c.source_mount.rstrip('/'))}"] if source else []
        p = self.env_prefix
        return f"exported by the batch shell as {p}*", [f"{p}{v}" for v in ["PYTHONNOUSERSITE=1", *own]]

    def notebook(self, image: str, workdir: str, cpus: int, jupyter: list[str]) -> str:
        """The environment passes as is (no --cleanenv: Jupyter's token and the user's shell)."""
        return f"{self.name} exec --nv {shlex.quote(image)} {shlex.join(jupyter)}"

    def probe(self, image: str, package: str, mount: str, python: str) -> list[str]:
        m = mount.rstrip("/")
        bind = ["--bind", f"{package}:{m}/hpctrain:ro", "--env", f"PYTHONPATH={m}"]
        return [self.name, "exec", "--nv", "--cleanenv", *bind, image, "python3", "-m", "hpctrain", "doctor", "--json"]

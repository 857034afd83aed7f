"""No image: every task runs the host's Python (a test cluster, a site without containers, or the
login node's own venv), the submitted hpctrain first on PYTHONPATH (shell/none.sh)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from hpctrain import shellfile
from hpctrain.site.runtimes.base import PY_VAR, Container, Found


@dataclass(frozen=True)
class NoImage:
    """container.runtime none: the host's Python; modules (not container_modules) set it up."""

    name: str = "none"
    help: str = "the host's Python"
    image_kind: str = ""
    module_stem: str = ""
    command: str = ""
    not_found_hint: str = ""

    def claims(self, image: str) -> bool:
        return False

    def detect(self, shell_prefix: str = "", module: str = "") -> Found | None:
        return None  # always there: nothing to find

    def check(self, binds: list[str], stage_to: str = "") -> None:
        """The host sees every path as it is."""

    def branch(self, c: Container, binds: list[str], host_python: str, stage_to: str = "") -> list[str]:
        return [f"{PY_VAR}=({host_python})", *shellfile.lines("none.sh")]

    def stage(self, c: Container) -> list[str]:
        return []  # no image to stage

    def task_words(
        self, c: Container, binds: list[str], host_python: str, own: list[str], workdir: str
    ) -> tuple[list[str], list[str]]:
        return [], [host_python]

    def task_env(self, c: Container, source: str) -> tuple[str, list[str]]:
        """The snapshot's parent first on PYTHONPATH, unless it is an installed copy (site-packages)."""
        parent = source.rsplit("/", 1)[0]
        if not source or parent.endswith(("/site-packages", "/dist-packages")):
            return "exported by the batch shell", []
        return "exported by the batch shell", [f"PYTHONPATH={shlex.quote(parent)}${{PYTHONPATH:+:$PYTHONPATH}}"]

    def notebook(self, image: str, workdir: str, cpus: int, jupyter: list[str]) -> str:
        return f"python3 -m {shlex.join(jupyter)}"

    def probe(self, image: str, package: str, mount: str, python: str) -> list[str]:
        return [python, "-m", "hpctrain", "doctor", "--json"]


RUNTIME = NoImage()

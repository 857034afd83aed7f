"""A container runtime that is not one of hpctrain's own, written as a site or a plugin would write
one: this module and its branch of the batch shell beside it (fake_runtime.sh), nothing else.

`fakert run [--bind SRC:DST[:ro]]... IMAGE COMMAND...` starts COMMAND "in" IMAGE (a .fimg); the tests
put a stand-in `fakert` on PATH (tests/site/test_fake_runtime.py). Registered with
`hpctrain.site.runtimes.registered(RUNTIME)`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from hpctrain import shellfile
from hpctrain.errors import LaunchError
from hpctrain.site.runtimes.base import Container, Found, output

BRANCH = Path(__file__).with_suffix(".sh")


@dataclass(frozen=True)
class FakeRuntime:
    name: str = "fakert"
    help: str = "fakert run of a .fimg (a test's runtime)"
    image_kind: str = "fimg"
    module_stem: str = "fakert"
    command: str = "fakert"
    not_found_hint: str = "put fakert on PATH"

    def claims(self, image: str) -> bool:
        return image.endswith(".fimg")

    def detect(self, shell_prefix: str = "", module: str = "") -> Found | None:
        text = output(["fakert", "--version"], shell_prefix)
        if text and text.startswith("fakert version"):
            return Found(self.name, f"fakert --version: {text.strip()}", module)
        return None

    def check(self, binds: list[str], stage_to: str = "") -> None:
        if stage_to:
            raise LaunchError(f"data.stage_to={stage_to!r}: fakert cannot bind a node-local directory")

    def branch(self, c: Container, binds: list[str], host_python: str, stage_to: str = "") -> list[str]:
        return [
            shellfile.array("hpctrain_fakert_binds", binds),
            shellfile.assign("hpctrain_fakert_mount", c.source_mount.rstrip("/")),
            shellfile.assign("hpctrain_fakert_python", c.python),
            *shellfile.lines(BRANCH),
        ]

    def stage(self, c: Container) -> list[str]:
        return []  # a .fimg is read where it is

    def task_words(
        self, c: Container, binds: list[str], host_python: str, own: list[str], workdir: str
    ) -> tuple[list[str], list[str]]:
        words = ["fakert", "run"] + [w for b in [*binds, *own] for w in ("--bind", shellfile.word(b))]
        return [], [*words, shlex.quote(c.image), shlex.quote(c.python)]

    def task_env(self, c: Container, source: str) -> tuple[str, list[str]]:
        return "passed as is by fakert", []

    def notebook(self, image: str, workdir: str, cpus: int, jupyter: list[str]) -> str:
        return shlex.join(["fakert", "run", image, *jupyter])

    def probe(self, image: str, package: str, mount: str, python: str) -> list[str]:
        m = mount.rstrip("/")
        return ["fakert", "run", "--bind", f"{package}:{m}/hpctrain:ro", image, "python3", "-m", "hpctrain", "doctor"]


RUNTIME = FakeRuntime()

"""Which container runtimes a node has: Apptainer, SingularityCE, pyxis (for `doctor` and `cluster init`).

What tells them apart (docs/launch.md, "Container runtimes", has the sources):
- `apptainer --version` → "apptainer version 1.3.4";
- `singularity --version` → "apptainer version …" on an Apptainer site (it installs `singularity` as a
  link to itself) or "singularity-ce version 4.1.0" for SingularityCE, which has no `apptainer`;
- pyxis is a SPANK plugin: srun lists its options, so `srun --help` shows `--container-image`.
A runtime can also come from a module (`module load apptainer/1.3.4`): the module is loaded in a
throw-away shell and the same command asked. No torch: this runs on login nodes.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass

IMAGE_RUNTIMES = ("apptainer", "singularity", "pyxis")  # the order cluster init prefers them in


@dataclass(frozen=True)
class Found:
    """One runtime found on this node."""

    runtime: str  # apptainer | singularity | pyxis (container.runtime's value)
    evidence: str  # the command and the line that showed it, for the profile's comment
    module: str = ""  # the module that provides it ("" when it is on PATH already)


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


def flavour(version_text: str) -> str | None:
    """`singularity --version` (or `apptainer --version`) → apptainer | singularity; None if neither."""
    first = (version_text.strip().splitlines() or [""])[0].lower()
    if first.startswith("apptainer"):
        return "apptainer"  # Apptainer's own binary, called as apptainer or through its singularity link
    if re.match(r"singularity(-ce)?\b", first) or "singularityce" in first:
        return "singularity"  # SingularityCE (or Singularity 3.x before the split: SINGULARITYENV_ too)
    return None


def sif_runtime(tool: str, shell_prefix: str = "", module: str = "") -> Found | None:
    """`tool --version` (apptainer or singularity) → the runtime it really is."""
    text = output([tool, "--version"], shell_prefix)
    kind = flavour(text or "")
    if not kind:
        return None
    how = f"{tool} --version: {text.strip().splitlines()[0]}"
    return Found(kind, how + (f" (module {module})" if module else ""), module)


def pyxis_found(shell_prefix: str = "") -> Found | None:
    text = output(["srun", "--help"], shell_prefix)
    if text and "--container-image" in text:
        return Found("pyxis", "srun --help lists --container-image (the pyxis SPANK plugin)")
    return None


def detect(module_init: str = "", modules: list[str] = ()) -> list[Found]:
    """Every runtime here, each once, in IMAGE_RUNTIMES order: on PATH first, then from the newest
    `apptainer` and `singularity` modules (loaded with `module_init`, Lmod's init script)."""
    found: dict[str, Found] = {}
    for tool in ("apptainer", "singularity"):
        f = sif_runtime(tool)
        if f and f.runtime not in found:
            found[f.runtime] = f
    if module_init:
        for m in modules:
            prefix = f". {shlex.quote(module_init)} && module load {shlex.quote(m)}"
            f = sif_runtime(m.split("/")[0], prefix, m)
            if f and f.runtime not in found:
                found[f.runtime] = f
    p = pyxis_found()
    if p:
        found["pyxis"] = p
    return [found[r] for r in IMAGE_RUNTIMES if r in found]


def image_kind(image: str) -> str:
    """Which runtimes can run `image`: "sif" (Apptainer/SingularityCE) or "enroot" (pyxis: a squashfs
    from `enroot import`, or a registry URI such as nvcr.io#nvidia/pytorch:23.12-py3)."""
    if image.endswith((".sqsh", ".squashfs")) or "#" in image or "://" in image:
        return "enroot"
    return "sif"


def choose(found: list[Found], image: str) -> tuple[str, Found | None]:
    """The runtime for `image` (a path or URI; "" when none was given): the first found that runs
    it; for a SIF nothing found: apptainer (to review). No image: none."""
    if not image:
        return "none", None
    want = ("pyxis",) if image_kind(image) == "enroot" else ("apptainer", "singularity")
    for f in found:
        if f.runtime in want:
            return f.runtime, f
    return want[0], None

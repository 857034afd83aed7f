"""The `apptainer build` command line: fakeroot when not root, temp and cache dirs on scratch.

Apptainer unpacks every layer into APPTAINER_TMPDIR (default /tmp, often a small tmpfs on login
nodes) and caches blobs in APPTAINER_CACHEDIR (default ~/.apptainer/cache, inside a home quota).
An NGC PyTorch build needs ~30 GB there, so both go on scratch and free space is checked first.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hpctrain.images import ImageError

GIB = 1024**3


@dataclass(frozen=True)
class BuildPlan:
    argv: list[str]
    env: dict[str, str]  # only the variables this plan sets
    scratch: Path

    def command_line(self) -> str:
        """The exact shell command: `VAR=… VAR=… apptainer build …`."""
        return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in self.env.items()), shlex.join(self.argv)])


def default_scratch(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    for key in ("SCRATCH", "TMPDIR"):
        if env.get(key):
            return Path(env[key])
    return Path("/tmp")


def plan_build(
    recipe: str | Path,
    output: str | Path,
    scratch: str | Path | None = None,
    fakeroot: bool | None = None,
    force: bool = False,
    extra: list[str] | None = None,
) -> BuildPlan:
    """Build the command; checks the recipe exists and the output does not (unless `force`)."""
    recipe, output = Path(recipe), Path(output)
    if not recipe.is_file():
        raise ImageError(
            f"recipe {recipe} not found; the shipped ones are in recipes/ "
            "(e.g. recipes/ngc-pytorch-23.12.def)"
        )
    if output.exists() and not force:
        raise ImageError(f"{output} already exists; pass --force to overwrite it")
    if output.suffix != ".sif":
        raise ImageError(
            f"output {output} should end in .sif (for a sandbox directory call apptainer directly)"
        )
    scratch = Path(scratch) if scratch else default_scratch()
    if fakeroot is None:
        fakeroot = os.geteuid() != 0
    argv = ["apptainer", "build"]
    if fakeroot:
        argv.append("--fakeroot")
    if force:
        argv.append("--force")
    argv += list(extra or []) + [str(output), str(recipe)]
    env = {
        "APPTAINER_TMPDIR": str(scratch / "apptainer" / "tmp"),
        "APPTAINER_CACHEDIR": str(scratch / "apptainer" / "cache"),
    }
    return BuildPlan(argv, env, scratch)


def free_bytes(path: Path) -> int:
    """Free space on the filesystem that holds `path` (or its nearest existing parent)."""
    p = path.resolve()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def check_space(plan: BuildPlan, output: Path, min_free_gib: float) -> None:
    for what, path in (("scratch (APPTAINER_TMPDIR)", plan.scratch), ("the output directory", output.parent)):
        free = free_bytes(path)
        if free < min_free_gib * GIB:
            raise ImageError(
                f"only {free / GIB:.1f} GiB free on {what} {path}; the build needs about "
                f"{min_free_gib:g} GiB: pick another place with --scratch, or lower --min-free-gib"
            )


def run_build(plan: BuildPlan, output: Path, min_free_gib: float) -> int:
    """Check apptainer and space, then run the build; returns apptainer's exit status."""
    if shutil.which(plan.argv[0]) is None:
        raise ImageError(
            "apptainer is not on the PATH: on a cluster run `module load apptainer` "
            "(or `module spider apptainer` to find it); elsewhere install it "
            "(https://apptainer.org/docs/admin/main/installation.html), or use "
            "`--dry-run` to print the command"
        )
    check_space(plan, output, min_free_gib)
    print(f"+ {plan.command_line()}", file=sys.stderr, flush=True)
    for v in plan.env.values():
        Path(v).mkdir(parents=True, exist_ok=True)
    return subprocess.call(plan.argv, env={**os.environ, **plan.env})

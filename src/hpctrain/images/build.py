"""The `apptainer build` command line: fakeroot when not root, temp and cache dirs on scratch.

Apptainer unpacks every layer into APPTAINER_TMPDIR (default /tmp, often a small tmpfs on login
nodes) and caches blobs in APPTAINER_CACHEDIR (default ~/.apptainer/cache, inside a home quota).
An NGC PyTorch build needs ~30 GB there, so both go on scratch and free space is checked first.
With --fakeroot the temp dir must be on a local disk: the build maps uids in a user namespace, which
network file systems (NFS, Lustre, GPFS, BeeGFS...) refuse ("permission denied" mid-build; Apptainer's
admin guide, "Fakeroot (sub)uid/gid mapping"); then it goes to $TMPDIR or /tmp, and a network one is
refused with the fix (docs/sites.md).

The shipped recipes copy the hpctrain sources in (`%files pyproject.toml … src …`), relative paths that
Apptainer reads from the directory the build runs in: the checkout's root when this hpctrain is a
checkout, else a build context staged from the installed package (`stage_context`), so that
`hpctrain image build NAME` works from any directory and from a wheel.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hpctrain import __version__
from hpctrain.images import ImageError
from hpctrain.run.source import checkout_root, package_dir, source_hash
from hpctrain.shipped import recipe as find_recipe

GIB = 1024**3
# File system types (as /proc/mounts names them) that cannot do fakeroot's uid mapping.
NETWORK_FS = (
    "nfs",
    "nfs4",
    "lustre",
    "gpfs",
    "beegfs",
    "cifs",
    "smb3",
    "ceph",
    "fuse.ceph",
    "glusterfs",
    "fuse.glusterfs",
    "panfs",
    "wekafs",
    "9p",
    "fuse.sshfs",
)


@dataclass(frozen=True)
class BuildPlan:
    argv: list[str]
    env: dict[str, str]  # only the variables this plan sets
    scratch: Path
    context: Path  # where apptainer runs: the recipes' relative %files paths start here
    staged: bool = False  # context is a copy of the installed package, made by stage_context

    def command_line(self) -> str:
        """The exact shell command: `[cd CONTEXT && ]VAR=… VAR=… apptainer build …`."""
        cd = "" if self.context == Path.cwd().resolve() else f"cd {shlex.quote(str(self.context))} && "
        return cd + " ".join([*(f"{k}={shlex.quote(v)}" for k, v in self.env.items()), shlex.join(self.argv)])


# The staged context's pyproject.toml: the installed package as it is, with its version and base deps.
STAGED_PYPROJECT = """[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "hpctrain"
version = "{version}"
requires-python = ">=3.10"
dependencies = ["submitit==1.5.4", "pyyaml>=6", "spython>=0.3"]

[project.scripts]
hpctrain = "hpctrain.cli:main"

[tool.setuptools.packages.find]
where = ["src"]

[tool.setuptools.package-data]
hpctrain = ["**/*"]
"""


def build_context(scratch: Path) -> tuple[Path, bool]:
    """The checkout's root, or (staged=True) where `stage_context` puts a copy of the installed package."""
    root = checkout_root()
    if root is not None:
        return root.resolve(), False
    return (scratch / "apptainer" / f"context-{source_hash()}").resolve(), True


def stage_context(context: Path) -> None:
    """pyproject.toml, README.md and src/hpctrain (this package, without bytecode) in `context`, as the
    recipes' %files expect a checkout to have them."""
    src = context / "src" / "hpctrain"
    if src.is_dir():
        shutil.rmtree(src)
    shutil.copytree(package_dir(), src, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (context / "pyproject.toml").write_text(STAGED_PYPROJECT.format(version=__version__))
    (context / "README.md").write_text(f"hpctrain {__version__}, staged by `hpctrain image build`.\n")


def default_scratch(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    for key in ("SCRATCH", "TMPDIR"):
        if env.get(key):
            return Path(env[key])
    return Path("/tmp")


def fs_type(path: Path, mounts: str | Path = "/proc/mounts") -> str:
    """The type of the file system holding `path` (which may not exist yet): the mount table entry with
    the longest mount point above it ('' when unknown)."""
    p = Path(path).resolve()
    best, kind = -1, ""
    try:
        table = Path(mounts).read_text()
    except OSError:
        return ""
    for line in table.splitlines():
        f = line.split()
        if len(f) < 3:
            continue
        point = f[1].replace("\\040", " ")
        if (str(p) == point or str(p).startswith(point.rstrip("/") + "/")) and len(point) > best:
            best, kind = len(point), f[2]
    return kind


def build_tmpdir(
    scratch: Path, fakeroot: bool, env: dict[str, str] | None = None, mounts: str | Path = "/proc/mounts"
) -> Path:
    """APPTAINER_TMPDIR: the user's own, else on scratch; with fakeroot on a local disk ($TMPDIR or
    /tmp when scratch is a network file system). ImageError when fakeroot's would be on one."""
    env = dict(os.environ) if env is None else env
    if env.get("APPTAINER_TMPDIR"):
        tmp, why = Path(env["APPTAINER_TMPDIR"]), "APPTAINER_TMPDIR"
    else:
        tmp, why = scratch / "apptainer" / "tmp", "the scratch dir"
        if fakeroot and fs_type(scratch, mounts) in NETWORK_FS:
            tmp, why = Path(env.get("TMPDIR") or "/tmp") / f"apptainer-{os.getuid()}", "$TMPDIR or /tmp"
    kind = fs_type(tmp, mounts)
    if fakeroot and kind in NETWORK_FS:
        raise ImageError(
            f"the build's temp dir {tmp} ({why}) is on {kind}, a network file system: --fakeroot maps uids "
            "there, which it refuses; set APPTAINER_TMPDIR to a local disk (e.g. /tmp or node-local "
            "/localscratch with ~30 GiB free), or build as root with --no-fakeroot"
        )
    return tmp


def plan_build(
    recipe: str | Path,
    output: str | Path,
    scratch: str | Path | None = None,
    fakeroot: bool | None = None,
    force: bool = False,
    extra: list[str] | None = None,
    mounts: str | Path = "/proc/mounts",
) -> BuildPlan:
    """Build the command; checks the recipe exists (a file, or a shipped recipe's name) and the
    output does not (unless `force`)."""
    recipe, output = find_recipe(recipe), Path(output)
    if output.exists() and not force:
        raise ImageError(f"{output} already exists; pass --force to overwrite it")
    if output.suffix != ".sif":
        raise ImageError(f"output {output} should end in .sif (for a sandbox directory call apptainer directly)")
    scratch = Path(scratch) if scratch else default_scratch()
    context, staged = build_context(scratch)
    if context != Path.cwd().resolve():  # apptainer runs there: paths as given would move
        recipe, output = recipe.resolve(), output.resolve()
    if fakeroot is None:
        fakeroot = os.geteuid() != 0
    argv = ["apptainer", "build"]
    if fakeroot:
        argv.append("--fakeroot")
    if force:
        argv.append("--force")
    argv += list(extra or []) + [str(output), str(recipe)]
    env = {
        "APPTAINER_TMPDIR": str(build_tmpdir(scratch, fakeroot, mounts=mounts)),
        "APPTAINER_CACHEDIR": str(scratch / "apptainer" / "cache"),
    }
    return BuildPlan(argv, env, scratch, context, staged)


def free_bytes(path: Path) -> int:
    """Free space on the filesystem that holds `path` (or its nearest existing parent)."""
    p = path.resolve()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def check_space(plan: BuildPlan, output: Path, min_free_gib: float) -> None:
    tmp = Path(plan.env["APPTAINER_TMPDIR"])
    for what, path in (
        ("scratch (APPTAINER_TMPDIR)", plan.scratch if tmp.is_relative_to(plan.scratch) else tmp),
        ("the output directory", output.parent),
    ):
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
    if plan.staged:
        stage_context(plan.context)
    return subprocess.call(plan.argv, env={**os.environ, **plan.env}, cwd=plan.context)

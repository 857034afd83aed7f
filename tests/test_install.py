"""Install as users do: the wheel built from this checkout, in a fresh venv with the base dependencies
only (a login node), run from a directory that is not a checkout. An import hook in that venv refuses
numpy, torch, DALI (nvidia.*) and PIL and records every attempt, even one the code would catch."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

from hpctrain import __version__, shipped
from hpctrain.run.source import source_hash
from tests.helpers import digits_args, run_ranks

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "hpctrain"
HEAVY = ("numpy", "torch", "nvidia", "PIL")

# Loaded by a .pth file at every start of the venv's Python. mode "block": every heavy import raises
# ModuleNotFoundError, as where the package is not installed;
# mode "record": they load, and the log names the module that asked (numpy for matplotlib is fine,
# numpy for hpctrain is not).
HOOK = """
import os, sys
HEAVY = {heavy!r}
MODE = {mode!r}


class HeavyImportHook:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in HEAVY:
            return None
        f = sys._getframe(1)
        while f is not None and f.f_globals.get("__name__", "").startswith(("importlib", "_frozen_importlib")):
            f = f.f_back
        importer = f.f_globals.get("__name__", "?") if f is not None else "?"
        log = os.environ.get("HEAVY_IMPORT_LOG")
        if log:
            with open(log, "a") as fh:
                fh.write(f"{{name}} <- {{importer}}\\n")
        if MODE == "block":
            raise ModuleNotFoundError(f"HEAVY-IMPORT-BLOCKED: {{name}} (imported by {{importer}})", name=name)
        return None


sys.meta_path.insert(0, HeavyImportHook())
"""


# `apptainer build [--fakeroot] OUT DEF`, reduced to the property the build relies on: each %files
# source is found relative to the directory the build runs in.
FAKE_APPTAINER = r"""#!/bin/bash
set -euo pipefail
out=${@: -2:1}; def=${@: -1}
awk '/^%files/{f=1; next} /^%/{f=0} f && NF {print $1}' "$def" | while read -r src; do
  [ -e "$src" ] || { echo "FATAL: $src: no such file or directory (in $PWD)" >&2; exit 255; }
done
echo "built in $PWD" > "$out"
"""


def copy_sources(dest: Path) -> Path:
    """What a release is built from (pyproject, README, src), without the checkout's caches and links."""
    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dest / name)
    shutil.copytree(ROOT / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return dest


def clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment without the test's PYTHONPATH (it points at this checkout)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, **extra}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = copy_sources(tmp_path_factory.mktemp("release") / "hpctrain")
    out = src.parent / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
        check=True,
        env=clean_env(),
        timeout=300,
    )
    (whl,) = out.glob("hpctrain-*.whl")
    return whl


def make_venv(where: Path, requirement: str, mode: str) -> Path:
    """A venv without the system's packages, `requirement` installed from the index, the hook added."""
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(where)
    py = where / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", requirement], check=True, env=clean_env(), timeout=600)
    site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    (site / "heavy_import_hook.py").write_text(HOOK.format(heavy=HEAVY, mode=mode))
    (site / "heavy_import_hook.pth").write_text("import heavy_import_hook\n")
    return where


@pytest.fixture(scope="module")
def login_venv(wheel, tmp_path_factory) -> Path:
    return make_venv(tmp_path_factory.mktemp("venv") / "login", str(wheel), "block")


@pytest.fixture(scope="module")
def report_venv(wheel, tmp_path_factory) -> Path:
    """README step 1's login-node install: the wheel with the report extra (no torch, no scikit-learn);
    heavy imports load and are logged."""
    return make_venv(tmp_path_factory.mktemp("venv") / "report", f"hpctrain[report] @ {wheel.as_uri()}", "record")


@pytest.fixture(scope="module")
def finished_run(digits_root, tmp_path_factory) -> Path:
    """A short real run (this test process has torch), for `status` and `logs` on the login node."""
    runs = tmp_path_factory.mktemp("runs")
    run_ranks(1, digits_args(digits_root, runs, "done", "train.max_steps=4", "log.every=2"))
    return runs / "done"


class Login:
    """Run the venv's `hpctrain` from an empty directory; every heavy import attempt is logged."""

    def __init__(self, venv_dir: Path, cwd: Path, log: Path, path_prefix: str = ""):
        self.bin, self.cwd, self.log, self.path_prefix = venv_dir / "bin", cwd, log, path_prefix

    def __call__(self, *args: str, ok: bool = True, heavy: bool = False) -> subprocess.CompletedProcess:
        """`heavy`: the command needs an extra, whose import it attempts (and is refused)."""
        path = os.pathsep.join(filter(None, [self.path_prefix, os.environ["PATH"]]))
        r = subprocess.run(
            [str(self.bin / "hpctrain"), *args],
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=120,
            env=clean_env(HEAVY_IMPORT_LOG=str(self.log), PATH=path),
        )
        if ok:
            assert r.returncode == 0, f"hpctrain {' '.join(args)}: {r.stderr[-3000:]}"
        if heavy:
            self.log.unlink(missing_ok=True)
        assert not self.log.exists(), f"hpctrain {' '.join(args)} imported: {self.log.read_text()}"
        return r


def shipped_names() -> set[str]:
    """Every file the CLI serves by name, and the batch shell's files, as a path inside the package."""
    files = [
        *shipped.configs(),
        *shipped.profiles(),
        *shipped.recipes(),
        shipped.SBATCH_TEMPLATE,
        *(PKG / "launch" / "shell").glob("*.sh"),
    ]
    return {f"hpctrain/{p.relative_to(PKG).as_posix()}" for p in files}


def test_checkout_folders_are_links_to_the_shipped_ones():
    """One copy: the top-level configs/, recipes/, slurm/ of the checkout are the package's folders,
    and the version is written once (pyproject reads hpctrain.__version__; the recipes' labels match)."""
    for name in ("configs", "recipes", "slurm"):
        assert (ROOT / name).is_symlink() and (ROOT / name).resolve() == PKG / name, name
    assert shipped.SBATCH_TEMPLATE.is_file() and len(shipped.recipes()) == 3
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and 'version = { attr = "hpctrain.__version__" }' in pyproject
    for recipe in shipped.recipes():
        if recipe.suffix == ".def":
            assert f"hpctrain.version {__version__}\n" in recipe.read_text(), recipe.name


@pytest.mark.slow
def test_wheel_and_sdist_carry_configs_profiles_recipes_and_sbatch(wheel, tmp_path):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = shipped_names() - names
    assert not missing, f"not in the wheel: {sorted(missing)}"
    assert "hpctrain/data/prep/digits.u8.gz" in names  # the demo's images: `data digits` needs no scikit-learn
    assert wheel.name == f"hpctrain-{__version__}-py3-none-any.whl"
    # the size docs/packaging.md states for the wheel ("Install on a cluster", once the README's), within 20 %
    stated = re.search(r"`dist/hpctrain-[^`]+\.whl`,\s+about ([\d,]+) kB", (ROOT / "docs" / "packaging.md").read_text())
    assert stated, "docs/packaging.md no longer says how large the wheel is (`dist/hpctrain-….whl`, about N kB)"
    size_kb = wheel.stat().st_size / 1000
    assert abs(size_kb / float(stated.group(1).replace(",", "")) - 1) <= 0.2, f"the wheel is {size_kb:.0f} kB"
    src = copy_sources(tmp_path / "hpctrain")
    code = "from setuptools import build_meta as b; print(b.build_sdist('dist'))"
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=src, capture_output=True, text=True, env=clean_env(), timeout=300, check=True
    )
    sdist = src / "dist" / r.stdout.strip().splitlines()[-1]
    prefix = f"hpctrain-{__version__}/src/"
    with tarfile.open(sdist) as tar:
        in_sdist = {n.removeprefix(prefix) for n in tar.getnames() if n.startswith(prefix)}
    assert not shipped_names() - in_sdist, f"not in the sdist: {sorted(shipped_names() - in_sdist)}"


@pytest.mark.slow  # ~30 s alone: wheel, venv, a short run; more on a busy machine
def test_login_node_commands_from_the_wheel_import_no_numpy_torch_dali_pil(login_venv, finished_run, tmp_path):
    """Must show #1: the base dependencies only, an empty directory, heavy imports refused."""
    here = tmp_path / "empty"
    here.mkdir()
    fake = tmp_path / "bin"  # sbatch that accepts the job, as Slurm's prints its id: the submission path
    fake.mkdir()
    (fake / "sbatch").write_text(
        '#!/bin/sh\necho "$@" >> "$(dirname "$0")/sbatch.args"\necho "Submitted batch job 4242"\n'
    )
    (fake / "sbatch").chmod(0o755)
    hp = Login(login_venv, here, tmp_path / "heavy.log", str(fake))

    out = hp("--version").stdout.split()
    assert out[:4] == ["hpctrain", __version__, "(source", f"{source_hash(PKG)})"]  # the wheel is these sources
    assert "site-packages" in out[-1] and "git" not in out  # an installed copy: no commit to name

    dry = hp(
        "submit", "--config", "vit_b16_imagenet_4k", "--cluster", "example-ib", "--nodes", "16", "--dry-run"
    ).stdout
    assert "#SBATCH --nodes=16" in dry and "#SBATCH --ntasks-per-node=8" in dry and "srun --kill-on-bad-exit=1" in dry
    plan = hp("plan", "--config", "vit_b16_imagenet_4k", "--cluster", "example-ib", "--nodes", "16").stdout
    assert "16" in plan and "images/s" in plan

    shown = hp("config", "show", "vit_b16_imagenet_4k").stdout
    assert shown == (PKG / "configs" / "vit_b16_imagenet_4k.yaml").read_text() and shown.startswith("# ")
    listed = hp("config", "list").stdout
    assert all(f"  {p.stem} " in listed for p in [*shipped.configs(), *shipped.profiles()])
    assert "optim.lr " in hp("config", "--keys").stdout
    assert hp("config", "--config", "digits_vit").stdout.startswith("model:\n")

    status = hp("status", str(finished_run)).stdout
    assert "COMPLETED" in status and "4/4 (100 %)" in status
    assert json.loads(hp("status", str(finished_run), "--json").stdout)["state"] == "COMPLETED"
    assert hp("logs", str(finished_run)).stdout.strip()
    ev = hp("eval", str(finished_run), "--nodes", "1", "--cluster", "local", "--dry-run").stdout
    assert ev.startswith("#!/bin/bash\n") and "-m hpctrain.launch.task" in ev

    assert hp("image", "lint", "ngc-pytorch-23.12").stdout == "ngc-pytorch-23.12: ok\n"
    assert "ngc-pytorch-23.12.def" in hp("image", "list").stdout
    assert hp("image", "convert", "Dockerfile").stdout.startswith("Bootstrap: docker\n")
    (here / "not.sif").write_text("not an image")
    bad = hp("image", "inspect", "not.sif", ok=False)
    assert bad.returncode == 2 and bad.stderr.startswith("hpctrain: error: ") and len(bad.stderr.splitlines()) == 1

    assert "wrote vit.sbatch" in hp("sbatch-template").stdout
    assert (here / "vit.sbatch").read_text() == shipped.SBATCH_TEMPLATE.read_text()
    hp(
        "submit",
        "--config",
        "vit_b16_imagenet_4k",
        "--cluster",
        "example-ib",
        "--nodes",
        "16",
        "--gpus-per-node",
        "8",
        "--emit-sbatch",
        "mine.sbatch",
    )
    assert (here / "mine.sbatch").read_text().startswith("#!/bin/bash\n")
    hp("sweep", "--config", "vit_b16_imagenet_4k", "--cluster", "local", "--grid", "optim.lr=1e-3,2e-3", "--dry-run")
    for args in (
        ("data", "digits", "dg"),
        ("submit", "--config", "digits_vit"),
        ("export", str(finished_run), "-o", "x.pt"),
    ):
        r = hp(*args, ok=False, heavy=True)  # a command that needs the train extra: one line naming it
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
        assert re.fullmatch(
            r"hpctrain: error: `hpctrain \w+` needs \w+, which this install lacks: pip install 'hpctrain\[train\]'\n",
            r.stderr,
        ), r.stderr
    assert not (here / "data").exists() and not (here / "dg").exists()  # no folder or lock left behind
    init = hp("cluster", "init", "site", "-o", "site.yaml", ok=False)  # no Slurm client here: its one line
    assert init.returncode == 2 and init.stderr.startswith("hpctrain: error: no Slurm here"), init.stderr

    # a shipped recipe by name: its %files (pyproject.toml, README.md, src) are read relative to the
    # directory apptainer runs in, which for an installed copy is a staged context; the stand-in
    # checks they are there, as `apptainer build` would
    (fake / "apptainer").write_text(FAKE_APPTAINER)
    (fake / "apptainer").chmod(0o755)
    built = hp(
        "image",
        "build",
        "ngc-pytorch-23.12",
        "-o",
        "x.sif",
        "--scratch",
        str(tmp_path / "scratch"),
        "--min-free-gib",
        "0",
    )
    assert (here / "x.sif").is_file(), built.stderr
    (context,) = (tmp_path / "scratch" / "apptainer").glob("context-*")
    assert (here / "x.sif").read_text() == f"built in {context}\n"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "w"), str(context)],
        check=True,
        env=clean_env(),
        timeout=300,
    )  # what the recipe's `pip install /opt/hpctrain` builds
    (staged,) = (tmp_path / "w").glob("*.whl")
    assert not shipped_names() - set(zipfile.ZipFile(staged).namelist())

    # a real submission, up to sbatch: config, profile, batch script, submitit's pickle, the job record
    # on a login node whose controller answers `scontrol ping` (submit asks it before sbatch); its
    # other questions get no answer, as from a client without a slurm.conf
    site = tmp_path / "site-bin"
    site.mkdir()
    (site / "scontrol").write_text('#!/bin/sh\n[ "$1" = ping ] || exit 1\necho "Slurmctld(primary) at login1 is UP"\n')
    (site / "scontrol").chmod(0o755)
    hp = Login(login_venv, here, tmp_path / "heavy.log", os.pathsep.join([str(site), str(fake)]))
    sets = ["--set", f"data.root={here}", "--set", f"run.dir={here / 'runs'}"]
    sub = hp("submit", "--config", "vit_b16_imagenet_4k", "--cluster", "local", "--nodes", "2", *sets).stdout
    assert "submitted Slurm job 4242" in sub and (here / "runs" / "vit_b16_4k" / "job.json").is_file()
    hp(
        "sweep",
        "--config",
        "vit_b16_imagenet_4k",
        "--cluster",
        "local",
        "--grid",
        "optim.lr=1e-3,2e-3",
        "--name",
        "sw",
        *sets,
    )
    assert len((fake / "sbatch.args").read_text().splitlines()) == 2


@pytest.mark.slow
def test_report_imports_numpy_and_pil_only_through_matplotlib(report_venv, finished_run, tmp_path):
    """`report` needs the report extra (matplotlib, which itself needs numpy and Pillow): hpctrain's own
    modules still import neither, and torch/DALI not at all."""
    env_dir = report_venv
    (tmp_path / "empty").mkdir()
    log = tmp_path / "heavy.log"
    r = subprocess.run(
        [str(env_dir / "bin" / "hpctrain"), "report", str(finished_run), "-o", "r.png"],
        cwd=tmp_path / "empty",
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(HEAVY_IMPORT_LOG=str(log)),
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "empty" / "r.png").stat().st_size > 1000
    seen = [line.split(" <- ") for line in log.read_text().splitlines()]
    assert any(importer.startswith("matplotlib") for _, importer in seen)  # the hook saw them
    assert not [(m, i) for m, i in seen if i.startswith("hpctrain") or m.split(".")[0] in ("torch", "nvidia")]


@pytest.mark.slow
def test_the_demo_on_a_login_node_install_writes_the_digits_and_dry_runs(report_venv, tmp_path):
    """Issue 56 item 1: on README step 1's install (wheel[report]: numpy and Pillow through matplotlib,
    no torch, no scikit-learn) `data digits` writes the demo's images (they ship in the wheel), the
    demo's dry run writes nothing, and a local run of it is refused in one line before any file."""
    here = tmp_path / "empty"
    here.mkdir()
    log = tmp_path / "heavy.log"

    def hp(*args: str) -> subprocess.CompletedProcess:
        log.unlink(missing_ok=True)
        return subprocess.run(
            [str(report_venv / "bin" / "hpctrain"), *args],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=300,
            env=clean_env(HEAVY_IMPORT_LOG=str(log)),
        )

    def heavy_asked() -> set[str]:
        return {line.split(" <- ")[0].split(".")[0] for line in log.read_text().splitlines()} if log.exists() else set()

    py = report_venv / "bin" / "python"
    assert subprocess.run([str(py), "-c", "import sklearn"], capture_output=True, env=clean_env()).returncode != 0

    r = hp("data", "digits", "dg")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout == "wrote 1438 train and 359 val images to dg\n"
    assert len(list((here / "dg").rglob("*.png"))) == 1797
    assert not heavy_asked() & {"torch", "nvidia"}

    dry = hp("submit", "--config", "digits_vit", "--dry-run")
    assert dry.returncode == 0 and "#SBATCH" in dry.stdout, dry.stderr[-3000:]
    assert not heavy_asked() & {"torch", "nvidia"}
    assert sorted(p.name for p in here.iterdir()) == ["dg"]  # no data/digits, no runs/: a dry run writes nothing

    local = hp("submit", "--config", "digits_vit", "--local")
    assert local.returncode == 2 and local.stderr == (
        "hpctrain: error: `hpctrain submit` needs torch, which this install lacks: pip install 'hpctrain[train]'\n"
    ), local.stderr[-3000:]
    assert sorted(p.name for p in here.iterdir()) == ["dg"]

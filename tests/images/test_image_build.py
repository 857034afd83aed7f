"""`image build`: the exact apptainer command, and clear errors before anything runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpctrain.errors import UserError
from hpctrain.images import ImageError
from hpctrain.images.build import plan_build
from tests.helpers import hpctrain

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "ngc-pytorch-23.12.def"


def test_dry_run_prints_exact_command(tmp_path):
    out = tmp_path / "ngc.sif"
    r = hpctrain("image", "build", str(RECIPE), "-o", str(out), "--scratch", "/scratch/me", "--fakeroot", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stdout == (  # from the test's own directory: apptainer runs in the checkout (the recipes' %files)
        f"cd {RECIPE.parents[1]} && APPTAINER_TMPDIR=/scratch/me/apptainer/tmp "
        f"APPTAINER_CACHEDIR=/scratch/me/apptainer/cache apptainer build --fakeroot {out} {RECIPE.resolve()}\n"
    )
    assert not out.exists()


def test_scratch_defaults_and_fakeroot_when_not_root(tmp_path):
    r = hpctrain(
        "image",
        "build",
        str(RECIPE),
        "-o",
        str(tmp_path / "a.sif"),
        "--dry-run",
        env={"SCRATCH": "/lustre/u1"},
    )
    assert " && APPTAINER_TMPDIR=/lustre/u1/apptainer/tmp APPTAINER_CACHEDIR=/lustre/u1/" in r.stdout
    assert ("--fakeroot" in r.stdout) == (os.geteuid() != 0)


def test_without_apptainer_says_what_to_do(tmp_path):
    r = hpctrain(
        "image", "build", str(RECIPE), "-o", str(tmp_path / "a.sif"), env={"PATH": str(tmp_path)}
    )  # an empty PATH: no apptainer
    assert r.returncode == 2
    assert r.stderr.startswith(
        "hpctrain: error: apptainer is not on the PATH: on a cluster run `module load apptainer`"
    )
    assert len(r.stderr.strip().splitlines()) == 1


def test_free_space_checked_first(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apptainer").write_text("#!/bin/sh\necho RAN >&2\n")
    (fake / "apptainer").chmod(0o755)
    r = hpctrain(
        "image",
        "build",
        str(RECIPE),
        "-o",
        str(tmp_path / "a.sif"),
        "--scratch",
        str(tmp_path),
        "--min-free-gib",
        "1000000",
        env={"PATH": f"{fake}:{os.environ['PATH']}"},
    )
    assert r.returncode == 2 and "RAN" not in r.stderr
    assert f"GiB free on scratch (APPTAINER_TMPDIR) {tmp_path}; the build needs about 1e+06 GiB" in r.stderr


def test_bad_inputs(tmp_path):
    with pytest.raises(UserError, match="recipe .nope.def. not found: give a definition file or a shipped recipe"):
        plan_build("nope.def", tmp_path / "a.sif")
    (tmp_path / "a.sif").write_bytes(b"")
    with pytest.raises(ImageError, match="already exists; pass --force"):
        plan_build(RECIPE, tmp_path / "a.sif")
    assert "--force" in plan_build(RECIPE, tmp_path / "a.sif", force=True).argv


def test_build_runs_apptainer_with_scratch_env(tmp_path):
    """A stand-in `apptainer` on the PATH records what it was given."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apptainer").write_text('#!/bin/sh\necho "$APPTAINER_TMPDIR $APPTAINER_CACHEDIR $*" > "$LOG"\n')
    (fake / "apptainer").chmod(0o755)
    log, out = tmp_path / "log", tmp_path / "a.sif"
    r = hpctrain(
        "image",
        "build",
        str(RECIPE),
        "-o",
        str(out),
        "--scratch",
        str(tmp_path / "s"),
        "--min-free-gib",
        "0",
        "--no-fakeroot",
        env={"PATH": f"{fake}:{os.environ['PATH']}", "LOG": str(log)},
    )
    assert r.returncode == 0, r.stderr
    s = tmp_path / "s" / "apptainer"
    assert log.read_text() == f"{s}/tmp {s}/cache build {out} {RECIPE.resolve()}\n"
    assert (s / "tmp").is_dir() and (s / "cache").is_dir()


def test_shipped_recipe_by_name_builds_from_the_checkout_root(tmp_path):
    """From any directory, a shipped recipe's name builds in the checkout's root, where its relative
    %files (pyproject.toml, README.md, src) are; paths given relative to the caller are made absolute."""
    root = RECIPE.parents[1]
    shipped = root / "src" / "hpctrain" / "recipes" / RECIPE.name
    r = hpctrain("image", "build", "ngc-pytorch-23.12", "-o", "ngc.sif", "--scratch", "/s", "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (
        f"cd {root} && APPTAINER_TMPDIR=/s/apptainer/tmp APPTAINER_CACHEDIR=/s/apptainer/cache "
        f"apptainer build {'--fakeroot ' if os.geteuid() else ''}{tmp_path / 'ngc.sif'} {shipped}\n"
    )
    for src in ("pyproject.toml", "README.md", "src"):
        assert f"\n    {src} /opt/hpctrain/" in RECIPE.read_text() and (root / src).exists()


def test_unknown_recipe_lists_the_shipped_ones(tmp_path):
    r = hpctrain("image", "lint", "ngc-pytorch", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr == (
        "hpctrain: error: recipe 'ngc-pytorch' not found: give a definition file or a shipped recipe: Dockerfile, "
        "ngc-pytorch-23.12.def, pytorch-cuda.def (`hpctrain image list`)\n"
    )


def mount_table(tmp_path: Path, **fs: str) -> Path:
    """A /proc/mounts-format table: / on ext4, and tmp_path/<name> on the given file system type."""
    t = tmp_path / "mounts"
    t.write_text("/dev/sda1 / ext4 rw 0 0\n" + "".join(f"srv:/{n} {tmp_path / n} {k} rw 0 0\n" for n, k in fs.items()))
    return t


def test_fakeroot_temp_dir_leaves_lustre_scratch_for_local_disk(tmp_path, monkeypatch):
    """Site property: $SCRATCH is Lustre, which refuses fakeroot's uid mapping; the unpacked layers go
    to the local $TMPDIR instead (the cache, plain files, stays on scratch)."""
    mounts = mount_table(tmp_path, lustre="lustre")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "local"))
    monkeypatch.delenv("APPTAINER_TMPDIR", raising=False)
    plan = plan_build(RECIPE, tmp_path / "a.sif", tmp_path / "lustre" / "me", fakeroot=True, mounts=mounts)
    assert plan.env["APPTAINER_TMPDIR"] == str(tmp_path / "local" / f"apptainer-{os.getuid()}")
    assert plan.env["APPTAINER_CACHEDIR"] == str(tmp_path / "lustre" / "me" / "apptainer" / "cache")
    plain = plan_build(RECIPE, tmp_path / "a.sif", tmp_path / "lustre" / "me", fakeroot=False, mounts=mounts)
    assert plain.env["APPTAINER_TMPDIR"] == str(tmp_path / "lustre" / "me" / "apptainer" / "tmp")


@pytest.mark.parametrize("kind", ["lustre", "gpfs", "nfs4", "beegfs"])
def test_fakeroot_temp_dir_on_a_network_file_system_is_refused(tmp_path, monkeypatch, kind):
    mounts = mount_table(tmp_path, net=kind)
    monkeypatch.setenv("APPTAINER_TMPDIR", str(tmp_path / "net" / "tmp"))
    with pytest.raises(ImageError) as e:
        plan_build(RECIPE, tmp_path / "a.sif", tmp_path / "scratch", fakeroot=True, mounts=mounts)
    msg = str(e.value)
    assert "\n" not in msg and f"is on {kind}, a network file system" in msg and "set APPTAINER_TMPDIR" in msg

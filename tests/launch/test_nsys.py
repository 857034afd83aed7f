"""`hpctrain submit --nsys-ranks`: the chosen tasks run their Python under `nsys profile` with
--capture-range=cudaProfilerApi, the others as before. A fake `nsys` (tests/launch/fake_nsys.sh: records
its arguments and runs the program, as nsys does) proves the wrapping; under the fake apptainer the
nsys looked for is the image's, not the host's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.config import load
from hpctrain.errors import LaunchError
from hpctrain.launch.container import python_lines
from hpctrain.launch.submit import Request, parse_ranks, plan_job
from hpctrain.site.profile import ContainerSection, load_profile
from hpctrain.site.runtimes.base import PY_VAR
from tests.helpers import hpctrain

HERE = Path(__file__).parent
SHOW = "import os; print('nsys-env=' + os.environ.get('HPCTRAIN_NSYS', '-'))"


def task(tmp_path: Path, runtime: str, rank: int, extra_path: str = "") -> subprocess.CompletedProcess:
    """The batch script's Python block with --nsys-ranks 0,2, then one task of global rank `rank`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, target in (("nsys", HERE / "fake_nsys.sh"), ("apptainer", HERE / "fake_apptainer.sh")):
        if not (bin_dir / name).exists():
            (bin_dir / name).symlink_to(target)
    image = tmp_path / "image.sif"
    image.write_bytes(b"fake")
    c = ContainerSection(runtime=runtime, image=str(image), bind_source=False)
    lines = python_lines(c, [], sys.executable, "''", "", [0, 2], str(tmp_path / "run dir" / "profile"))
    script = "\n".join(["set -eo pipefail", *lines, f'"${{{PY_VAR}[@]}}" -c "$1"'])
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "FAKE_APPTAINER_PYTHON": sys.executable,
        "SLURM_PROCID": str(rank),
        "FAKE_NSYS_LOG": str(tmp_path / "nsys.log"),
        "HOME": str(tmp_path),
    }
    return subprocess.run(["bash", "-c", script, "job", SHOW], capture_output=True, text=True, env=env, timeout=60)


def test_chosen_rank_runs_under_nsys_with_the_cuda_profiler_api_capture_range(tmp_path):
    r = task(tmp_path, "none", 2)
    assert r.returncode == 0, r.stderr
    assert "nsys-env=1" in r.stdout  # the loop learns it runs under nsys
    args = (tmp_path / "nsys.log").read_text().splitlines()
    assert len(args) == 1
    assert args[0].startswith("profile --capture-range=cudaProfilerApi --capture-range-end=stop ")
    assert f"--output={tmp_path / 'run dir' / 'profile'}/nsys-rank-2 {sys.executable} -c {SHOW}" in args[0]
    assert (tmp_path / "run dir" / "profile").is_dir()


def test_other_ranks_run_python_directly(tmp_path):
    r = task(tmp_path, "none", 1)
    assert r.returncode == 0, r.stderr
    assert "nsys-env=-" in r.stdout
    assert not (tmp_path / "nsys.log").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="the fake apptainer needs unshare --mount (root)")
def test_in_an_image_the_nsys_is_the_images_own(tmp_path):
    """The host's nsys (on the host PATH only) is not what an image task runs: the wrapper runs inside
    the image, whose PATH lacks it here, and says so in one line; a rank not chosen runs."""
    r = task(tmp_path, "apptainer", 0)
    assert r.returncode == 1
    assert "rank 0 finds no nsys on the PATH in the image" in r.stderr
    assert not (tmp_path / "nsys.log").exists()
    r = task(tmp_path, "apptainer", 1)
    assert r.returncode == 0 and "nsys-env=-" in r.stdout, r.stderr


def test_nsys_ranks_checks():
    assert parse_ranks("8,0, 8") == (0, 8)
    with pytest.raises(LaunchError, match="comma-separated whole numbers"):
        parse_ranks("0;1")
    prof = load_profile("local", [])
    cfg = load("digits_vit", ["run.dir=/tmp/r"])
    with pytest.raises(LaunchError, match="--nsys-ranks needs log.profile_steps"):
        plan_job(cfg, prof, Request(nodes=1, gpus_per_node=2, nsys_ranks=(0,)))
    cfg = load("digits_vit", ["run.dir=/tmp/r", "log.profile_steps=3-4"])
    with pytest.raises(LaunchError, match="rank 2 is not in this job of 2 tasks"):
        plan_job(cfg, prof, Request(nodes=1, gpus_per_node=2, nsys_ranks=(0, 2)))
    plan = plan_job(cfg, prof, Request(nodes=1, gpus_per_node=2, nsys_ranks=(1,)))
    assert plan.nsys_ranks == [1] and plan.nsys_dir == "/tmp/r/digits_vit/profile"


def test_submit_dry_run_script_wraps_the_tasks(tmp_path):
    r = hpctrain(
        "submit",
        "--dry-run=full",
        "--cluster",
        "local",
        "--nsys-ranks",
        "0",
        "--set",
        f"run.dir={tmp_path}",
        "--set",
        "log.profile_steps=3-4",
        "--config",
        "digits_vit",
    )
    assert r.returncode == 0, r.stderr
    assert "hpctrain_nsys=" in r.stdout and "--capture-range=cudaProfilerApi" in r.stdout
    r = hpctrain("submit", "--dry-run", "--cluster", "local", "--set", f"run.dir={tmp_path}", "--config", "digits_vit")
    assert "nsys" not in r.stdout

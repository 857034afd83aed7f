"""`hpctrain data pack --slurm`: the array job's script, and the array on the Slurm test cluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpctrain.data.prep import pack as pk
from hpctrain.launch import pack_array
from hpctrain.launch.pack_array import render
from hpctrain.launch.submit import Request
from hpctrain.site.profile import load_profile
from tests.helpers import dir_files, hpctrain
from tests.launch.jobs import hp

FAKE_APPTAINER = Path(__file__).with_name("fake_apptainer.sh")


def quiet(*_):
    pass


@pytest.fixture(scope="module")
def serial(digits_root, tmp_path_factory) -> Path:
    """The digits packed by one process: 1,438 train + 359 val images, 250 per shard: 6 + 2 shards."""
    out = tmp_path_factory.mktemp("serial")
    pk.pack(digits_root, out, 250, seed=7, log=quiet)
    return out


def test_array_script_follows_the_profile(digits_root, tmp_path):
    """The partition from the profile, --account from the command line (quoted), and the tasks'
    Python inside `apptainer exec` with the data and output folders bound, when the profile says so."""
    out = tmp_path / "out dir"
    plan = pk.plan_pack(digits_root, out, 250, groups=4, log=quiet)
    script = render(plan, str(digits_root), load_profile("example-ib"), Request(account="proj x"))
    assert "#SBATCH --array=0-3" in script and "#SBATCH --partition=gpu" in script
    assert "#SBATCH --account='proj x'" in script
    assert f"#SBATCH --output='{out.resolve()}/.pack/logs/%A_%a.out'" in script
    assert "apptainer exec --nv --cleanenv" in script
    assert f"--bind {digits_root.resolve()}" in script and f"--bind '{out.resolve()}'" in script
    assert f"-m hpctrain.data.prep.pack '{out.resolve()}' \"$SLURM_ARRAY_TASK_ID\"" in script
    r = hpctrain("data", "pack", str(digits_root), str(out), "--slurm", "--dry-run", "--partition", "a\nb", timeout=120)
    assert r.returncode == 2 and "--partition: contains a control character" in r.stderr
    r = hpctrain("data", "pack", str(digits_root), str(out), "--partition", "x", timeout=120)
    assert r.returncode == 2 and "--partition only apply to a Slurm pack: add --slurm" in r.stderr
    login = (
        "import sys, runpy; sys.argv = ['hpctrain', 'data', 'pack', sys.argv[1], sys.argv[2], '--slurm', "
        "'--dry-run']\ntry:\n    runpy.run_module('hpctrain', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "print('torch imported:', 'torch' in sys.modules, file=sys.stderr)"
    )
    r = subprocess.run(
        [sys.executable, "-c", login, str(digits_root), str(out)], capture_output=True, text=True, timeout=60
    )
    assert "#SBATCH --array=0-2\n" in r.stdout and "torch imported: False" in r.stderr, r.stderr


@pytest.mark.slurm
def test_slurm_array_pack_in_the_image_equals_the_local_pack(slurm_cluster, digits_root, serial, tmp_path):
    """3 array tasks, each in (a stand-in of) the profile's Apptainer image; then a lost shard: the
    same command resubmits its group alone and the result is again byte for byte the local pack."""
    image = tmp_path / "image"
    (image / "bin").mkdir(parents=True)
    (image / "bin" / "apptainer").symlink_to(FAKE_APPTAINER)
    (image / "image.sif").write_bytes(b"fake")
    (image / "site").mkdir()  # the image's Python says where it runs
    (image / "site" / "sitecustomize.py").write_text("import sys; print('python in the image', file=sys.stderr)\n")
    prof = tmp_path / "site.yaml"
    prof.write_text(
        yaml.safe_dump(
            {
                "name": "site",
                "slurm": {"time": "10"},
                "container": {
                    "runtime": "apptainer",
                    "image": str(image / "image.sif"),
                    "source_mount": str(tmp_path / "mnt"),
                },
            }
        )
    )
    env = {
        "PATH": f"{image / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "FAKE_APPTAINER_PYTHON": sys.executable,
        "FAKE_APPTAINER_SITE": str(image / "site"),
    }
    out = tmp_path / "shards"
    args = (
        "data",
        "pack",
        str(digits_root),
        str(out),
        "--shard-size",
        "250",
        "--seed",
        "7",
        "--workers",
        "3",
        "--slurm",
        "--cluster",
        str(prof),
        "--wait",
    )
    r = hp(slurm_cluster, *args, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 tasks pack 8 shards" in r.stdout and "all 3 groups packed" in r.stdout
    assert dir_files(out) == dir_files(serial)
    logs = sorted((out / ".pack" / "logs").glob("*.out"))
    assert len(logs) == 3
    text = "".join(p.read_text() for p in logs)
    assert text.count("python in the image") == 3 and "wrote the shard index" in text, text
    (out / "train-00003.tar").unlink()  # group 1 (shards 2-4) lost a file
    again = hp(slurm_cluster, *args, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "the 1 of 3 groups not packed yet (1)" in again.stdout
    assert dir_files(out) == dir_files(serial)


def test_pack_wait_asks_squeue_at_the_followers_pace(monkeypatch):
    """`data pack --slurm --wait` of a pack that takes hours: squeue 5, 15, 30 s after the submission,
    then once a minute (watch/follow.py), not every 2 s."""
    answers = iter([True] * 5 + [False])  # in the queue at the first 5 asks, gone at the 6th
    monkeypatch.setattr(pack_array, "job_queued", lambda job: next(answers))
    slept: list[float] = []
    pack_array.wait("7", sleep=slept.append)
    assert slept == [5, 10, 15, 60, 60, 60]

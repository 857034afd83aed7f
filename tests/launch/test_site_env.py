"""The site's environment on the Slurm test cluster: the tasks run the code that submitted the job
even when the image has an older hpctrain; a module's PYTHONPATH stays out of the image; a site's
`apptainer` module survives (no `module purge` unless the profile asks). The image is the fake
`apptainer` of tests/launch/fake_apptainer.sh (Apptainer's environment and bind rules)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpctrain.run.source import source_hash
from tests.launch.jobs import ROOT, digits_sets, hp, metrics, submit

pytestmark = pytest.mark.slurm
FAKE_APPTAINER = Path(__file__).with_name("fake_apptainer.sh")
SRC = ROOT / "src" / "hpctrain"


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    """An "image" whose Python has an older hpctrain installed (another version, another hash)."""
    d = tmp_path_factory.mktemp("image")
    shutil.copytree(SRC, d / "site" / "hpctrain", ignore=shutil.ignore_patterns("__pycache__"))
    init = d / "site" / "hpctrain" / "__init__.py"
    init.write_text(init.read_text().replace('__version__ = "', '__version__ = "0.0.0-image-'))
    (d / "image.sif").write_bytes(b"fake")
    (d / "bin").mkdir()
    (d / "bin" / "apptainer").symlink_to(FAKE_APPTAINER)
    return d


def profile(image: Path, tmp_path: Path, **container) -> Path:
    p = tmp_path / "site.yaml"
    p.write_text(
        yaml.safe_dump(
            {
                "name": "site",
                "slurm": {"request_gpus": False, "gpus_per_node": 1, "max_gpus_per_node": 4, "time": "20"},
                "container": {
                    "runtime": "apptainer",
                    "image": str(image / "image.sif"),
                    "source_mount": str(tmp_path / "mnt"),
                    **container,
                },
            }
        )
    )
    return p


def image_env(image: Path) -> dict:
    return {
        "PATH": f"{image / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "FAKE_APPTAINER_PYTHON": sys.executable,
        "FAKE_APPTAINER_SITE": str(image / "site"),
    }


def test_image_with_an_older_hpctrain_runs_the_submitting_code(slurm_cluster, digits_root, image, tmp_path):
    job = submit(
        slurm_cluster,
        "--cluster",
        str(profile(image, tmp_path)),
        "--nodes",
        "2",
        *digits_sets(digits_root, tmp_path, "src", "train.max_steps=3", "train.eval_every_epochs=0"),
        env=image_env(image),
    )
    assert slurm_cluster.wait_done(job, 240) == "COMPLETED"
    rec = json.loads((tmp_path / "src" / "env.json").read_text())
    assert rec["source"]["running"] == rec["source"]["submitted"] == source_hash(SRC)
    assert rec["source"]["path"] == str(tmp_path / "mnt" / "hpctrain")
    assert "image" not in rec["hpctrain"] and rec["pythonpath"].split(":")[0] == str(tmp_path / "mnt")


def test_image_copy_that_differs_is_refused_before_training(slurm_cluster, digits_root, image, tmp_path):
    """Without the bind (container.bind_source=false) the image's older copy would train: every rank
    refuses with one line naming both hashes, and no step runs."""
    job = submit(
        slurm_cluster,
        "--cluster",
        str(profile(image, tmp_path, bind_source=False)),
        "--nodes",
        "2",
        *digits_sets(digits_root, tmp_path, "old", "train.max_steps=3"),
        env=image_env(image),
    )
    assert slurm_cluster.wait_done(job, 240) == "FAILED"
    run = tmp_path / "old"
    assert metrics(run, "train") == [] and not (run / "checkpoints").exists()
    log0 = (run / "logs" / "rank-0.log").read_text()
    assert f"not the code that submitted the job (source {source_hash(SRC)})" in log0
    assert str(image / "site" / "hpctrain") in log0


def test_container_modules_stay_out_of_the_image(slurm_cluster, digits_root, image, tmp_path):
    """Real Lmod: the site's `apptainer` module, loaded in the submitting shell, is the only way to
    the `apptainer` command and survives into the job (no purge); the profile's container module
    `pyenvmod` sets PYTHONPATH and CUDA_HOME on the host, which must not reach the image's Python."""
    mods = tmp_path / "modulefiles"
    mods.mkdir()
    (mods / "apptainer.lua").write_text(f'prepend_path("PATH", "{image / "bin"}")\n')
    (mods / "pyenvmod.lua").write_text(
        'setenv("PYTHONPATH", "/site/python/lib")\nsetenv("CUDA_HOME", "/site/cuda")\n'
        'setenv("HPCTRAIN_MODULE_MARK", "pyenvmod")\n'
    )
    prof = profile(image, tmp_path)
    data = yaml.safe_load(prof.read_text())
    data.update(container_modules=["pyenvmod"], module_use=[str(mods)])
    prof.write_text(yaml.safe_dump(data))
    env = {k: v for k, v in slurm_cluster.env.items() if k != "HPCTRAIN_CLUSTER"}
    env.update(
        OMP_NUM_THREADS="1",
        FAKE_APPTAINER_PYTHON=sys.executable,
        FAKE_APPTAINER_SITE=str(image / "site"),
        MODULEPATH=str(mods),
    )
    cmd = (
        f"module load apptainer && command -v apptainer && {sys.executable} -m hpctrain submit --config "
        f"configs/digits_vit.yaml --cluster {prof} --nodes 2 "
        + " ".join(digits_sets(digits_root, tmp_path, "mods", "train.max_steps=3", "train.eval_every_epochs=0"))
    )
    r = subprocess.run(["bash", "-lc", cmd], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    job = r.stdout.split("submitted Slurm job ")[1].split(":")[0]
    assert slurm_cluster.wait_done(job, 240) == "COMPLETED"
    rec = json.loads((tmp_path / "mods" / "env.json").read_text())
    shell = (tmp_path / "mods" / "submitit" / f"{job}_0_log.out").read_text()  # the batch shell's banner
    assert "modules: apptainer:pyenvmod" in shell, shell  # both loaded on the host, apptainer kept
    assert rec["env"]["HPCTRAIN_MODULE_MARK"] == "pyenvmod"  # allow-listed variables do pass
    assert rec["pythonpath"].split(":")[0] == str(tmp_path / "mnt") and rec["cuda_home"] is None
    assert "/site/python/lib" not in rec["pythonpath"]
    st = hp(slurm_cluster, "status", job)
    assert "COMPLETED" in st.stdout

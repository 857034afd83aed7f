"""The image-stack passes (.ci/stack): the tested stack is read from each recipe's labels, the
package floors are the oldest stack tested, and the DALI executor's arguments fit the DALI there.

Runs in the main pass and in every stack pass (.ci/stack's SUBSET); under a stack pass
(HPCTRAIN_STACK set) it also checks that the venv holds the stack its recipe labels.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpctrain.data import dali_compat
from hpctrain.train import compat

ROOT = Path(__file__).resolve().parent.parent
STACK = ROOT / ".ci" / "stack"
RECIPES = sorted((ROOT / "recipes").glob("*.def"))
IMAGE_RECIPES = [r for r in RECIPES if "pytorch.version" in r.read_text()]  # the images with a torch stack


def show(recipe: Path) -> dict[str, str]:
    """`.ci/stack RECIPE --show`: the headline and the requirements, venv and key it would build."""
    r = subprocess.run(
        [sys.executable, str(STACK), str(recipe), "--show"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, HPCTRAIN_STACK_VENVS="/nonexistent/venvs"),
    )
    assert r.returncode == 0, r.stderr
    head, *rest = r.stdout.splitlines()
    return {"headline": head, **dict(line.split(": ", 1) for line in rest)}


def test_stack_comes_from_the_recipe_labels(tmp_path):
    ngc = ROOT / "recipes" / "ngc-pytorch-23.12.def"
    got = show(ngc)
    assert got["headline"].startswith(
        "stack ngc-pytorch-23.12: torch 2.2.2 (label 2.2.0a0+81ea7a4), DALI 1.32.0, numpy<2, Python 3.11"
    )
    reqs = got["requirements"].split()
    assert {"torch==2.2.2", "nvidia-dali-cuda120==1.32.0", "numpy>=1,<2"} <= set(reqs)
    assert got["venv"] == "/nonexistent/venvs/ngc-pytorch-23.12"
    # a copy with another DALI, torch and NumPy: other requirements, another key (the venv is rebuilt)
    copy = tmp_path / "ngc-pytorch-23.12.def"
    text = ngc.read_text()
    copy.write_text(
        text.replace("dali.version 1.32.0", "dali.version 1.33.0")
        .replace("pytorch.version 2.2.0a0+81ea7a4", "pytorch.version 2.5.1")
        .replace("numpy.version 1.x", "numpy.version 2.1")
    )
    moved = show(copy)
    assert {"torch==2.5.1", "nvidia-dali-cuda120==1.33.0", "numpy>=2,<3"} <= set(moved["requirements"].split())
    assert moved["key"] != got["key"] and moved["venv"] == got["venv"]
    assert moved["headline"].startswith("stack ngc-pytorch-23.12: torch 2.5.1, DALI 1.33.0, numpy<3")


def test_a_torch_that_pypi_lacks_and_no_mapping_is_refused(tmp_path):
    copy = tmp_path / "x.def"
    copy.write_text("Bootstrap: docker\nFrom: x\n\n%labels\n    pytorch.version 2.3.0a0+abc\n")
    r = subprocess.run([sys.executable, str(STACK), str(copy), "--show"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "add the 2.3 series' last release to TORCH_FOR_PRERELEASE" in r.stderr


@pytest.mark.parametrize("recipe", IMAGE_RECIPES, ids=lambda p: p.stem)
def test_a_recipe_installs_the_dali_it_labels(recipe):
    """A recipe that pip-installs DALI pins the version of its dali.version label (the stack tested)."""
    text = recipe.read_text()
    label = re.search(r"^\s+dali\.version (\S+)$", text, re.M)
    assert label, f"{recipe.name}: no dali.version label"
    pins = re.findall(r'"nvidia-dali-cuda120==([^"]+)"', text)
    assert pins in ([], [label.group(1)]), f"{recipe.name} installs DALI {pins}, labels {label.group(1)}"


def test_floors_are_the_oldest_stack_tested():
    """pyproject's `torch>=` and `nvidia-dali-cuda120>=` are the oldest image's (a floor that no pass
    tests is not a floor), and the compat modules assume the same."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    torch_floor = re.search(r'"torch>=(\d+)\.(\d+)"', pyproject)
    dali_floor = re.search(r'"nvidia-dali-cuda120>=(\d+)\.(\d+)"', pyproject)
    assert torch_floor and dali_floor
    torches = [
        compat.version_tuple(re.search(r"pytorch\.version (\S+)", r.read_text()).group(1)) for r in IMAGE_RECIPES
    ]
    dalis = [
        dali_compat.version_tuple(re.search(r"dali\.version (\S+)", r.read_text()).group(1)) for r in IMAGE_RECIPES
    ]
    assert tuple(map(int, torch_floor.groups())) == min(torches) == compat.MIN_TORCH
    assert tuple(map(int, dali_floor.groups())) == min(dalis) == dali_compat.MIN_DALI


@pytest.mark.parametrize(
    ("version", "dynamic"), [("1.32.0", False), ("1.43.0", False), ("1.44.0", True), ("1.53.0", True), ("2.4.0", True)]
)
def test_executor_arguments_by_dali_version(version, dynamic):
    args = dali_compat.executor_args(version)
    assert args["exec_pipelined"] and args["exec_async"]
    assert ("exec_dynamic" in args) == dynamic


def test_the_installed_dali_takes_the_executor_arguments():
    """Pipeline() and Pipeline.deserialize() with this DALI's executor arguments: DALI 1.32 failed
    on `exec_dynamic` (an AssertionError in `_discriminate_args`), before any image was read."""
    dali = pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, pipeline_def, types

    from hpctrain.data.dali import pipeline_args

    args = pipeline_args(batch_size=2, threads=1, device=torch.device("cpu"), seed=1)

    @pipeline_def
    def pipe():
        return fn.random.uniform(range=[0.0, 1.0], shape=[3], dtype=types.FLOAT)

    p = pipe(**args)
    p.build()
    (want,) = p.run()
    assert want.as_array().shape == (2, 3)
    if not dali_compat.deserialize_takes_seed():
        return  # the loader traces every epoch there: it never deserialises
    q = dali.Pipeline.deserialize(pipe(**args).serialize(), **args)
    q.build()
    (got,) = q.run()
    assert (got.as_array() == want.as_array()).all()  # same seed, same graph: same numbers


def test_deserialize_draws_from_the_seed_given_where_dali_takes_it():
    """A graph traced with seed 1, deserialised with seed 2: the numbers of seed 2 where
    dali_compat says this DALI takes the seed, seed 1's again where it does not (1.32), which is why
    the loader traces each epoch there."""
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import Pipeline, fn, pipeline_def, types

    from hpctrain.data.dali import pipeline_args

    @pipeline_def
    def pipe():
        return fn.random.uniform(range=[0.0, 1.0], shape=[3], dtype=types.FLOAT)

    def draw(p):
        p.build()
        return p.run()[0].as_array()

    args = {s: pipeline_args(batch_size=2, threads=1, device=torch.device("cpu"), seed=s) for s in (1, 2)}
    traced = pipe(**args[1])
    graph = traced.serialize()
    one, two = draw(traced), draw(pipe(**args[2]))
    assert not (one == two).all()
    if not dali_compat.deserialize_takes_seed():  # 1.32's deserialize takes no device_id=None
        args[2]["device_id"] = types.CPU_ONLY_DEVICE_ID
    got = draw(Pipeline.deserialize(graph, **args[2]))
    assert (got == (two if dali_compat.deserialize_takes_seed() else one)).all()


@pytest.mark.skipif(not os.environ.get("HPCTRAIN_STACK"), reason="only under .ci/stack (HPCTRAIN_STACK set)")
def test_the_stack_pass_runs_the_stack_its_recipe_labels():
    """Under .ci/stack: the venv holds the torch and DALI that the recipe's labels name (so the
    DALI tests ran, not skipped, and on that DALI)."""
    got = show(ROOT / "recipes" / f"{os.environ['HPCTRAIN_STACK']}.def")
    reqs = dict(r.split("==") for r in got["requirements"].split() if "==" in r)
    assert torch.__version__.split("+")[0] == reqs["torch"]
    if "nvidia-dali-cuda120" in reqs:
        assert importlib.metadata.version("nvidia-dali-cuda120") == reqs["nvidia-dali-cuda120"]

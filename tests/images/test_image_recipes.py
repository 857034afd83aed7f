"""The shipped recipes lint clean, parse with spython and name the intended base images."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from spython.main.parse.parsers import SingularityParser

from hpctrain.images.lint import lint_file, lint_text

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
BASES = {
    "ngc-pytorch-23.12.def": "nvcr.io/nvidia/pytorch:23.12-py3",
    "pytorch-cuda.def": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-devel",
}


@pytest.mark.parametrize("name", sorted(BASES))
def test_recipe_lints_clean_and_parses(name):
    path = RECIPES / name
    assert lint_file(path) == []
    recipe = SingularityParser(str(path)).recipe
    (stage,) = recipe.values()
    assert stage.fromHeader.strip() == BASES[name]
    text = path.read_text()
    assert "Bootstrap: docker" in text
    assert "PYTHONNOUSERSITE=1" in "".join(stage.environ)
    assert any(lbl.startswith("hpctrain.version ") for lbl in stage.labels)
    assert "/opt/hpctrain" in "".join(stage.install)
    test = recipe_test_script(text)  # spython folds %test into %post
    for probe in (
        "import torch",
        "torch.cuda.is_available()",
        "nccl.version()",
        "import nvidia.dali",
        "libibverbs",
        "compat.MIN_TORCH",  # --no-deps installs: the floor is checked here, not by pip
        "torch.compile(",
    ):
        assert probe in test
    assert stage.cmd.strip() == 'exec hpctrain "$@"'


def recipe_test_script(text: str) -> str:
    """The %test section of a definition file."""
    return text.split("\n%test\n", 1)[1].split("\n%", 1)[0]


@pytest.mark.parametrize("name", sorted(BASES))
def test_recipe_images_can_compile(name):
    """torch.compile needs a C/C++ compiler: pytorch/pytorch's -runtime images have none, so no
    recipe builds on one, and each %test compiles a small function and runs it once."""
    assert not BASES[name].endswith("-runtime")
    text = (RECIPES / name).read_text()
    test = recipe_test_script(text)
    python = test.split("<<'PY'\n", 1)[1].split("\nPY", 1)[0]
    code = compile(python, f"{name} %test", "exec")  # the probe is valid Python
    assert "compile" in code.co_names and re.search(r"\bf\(x\)", python), "no compiled function is run"


def test_ngc_recipe_keeps_ngc_dali():
    text = (RECIPES / "ngc-pytorch-23.12.def").read_text()
    assert "--no-deps" in text and "nvidia-dali-cuda120" not in text  # no second DALI copy
    assert "dali.version 1.32.0" in text and "nccl.version 2.19.3" in text


def test_pytorch_cuda_recipe_adds_dali():
    assert "nvidia-dali-cuda120==" in (RECIPES / "pytorch-cuda.def").read_text()


def test_site_dockerfile_derives_from_ngc():
    first = next(ln for ln in (RECIPES / "Dockerfile").read_text().splitlines() if ln.startswith("FROM"))
    assert first.split()[1] == BASES["ngc-pytorch-23.12.def"]


def test_lint_finds_each_problem():
    text = """Bootstrap: docker
%post
    apt-get update
    export HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123456
    git clone https://me:pw123@example.org/x.git
    export TOKEN=$FROM_THE_ENVIRONMENT
%enviroment
    X=1
"""
    rules = {(p.line, p.rule) for p in lint_text(text)}
    assert rules == {
        (0, "test"),
        (1, "source"),
        (3, "post-errexit"),
        (4, "secret"),
        (5, "secret"),
        (7, "section"),
    }
    msgs = " ".join(str(p) for p in lint_text(text))
    assert "did you mean %environment?" in msgs and "set -eu" in msgs


def test_lint_cli_exit_status(tmp_path):
    bad = tmp_path / "bad.def"
    bad.write_text("From: ubuntu\n%post\n    set -eu\n%test\n    true\n")
    out = subprocess.run(
        [sys.executable, "-m", "hpctrain", "image", "lint", str(bad), str(RECIPES / "pytorch-cuda.def")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1
    assert f"{bad}:line 1: [bootstrap] no `Bootstrap:` header" in out.stdout
    assert "pytorch-cuda.def: ok" in out.stdout


@pytest.mark.parametrize("name", ["ngc-pytorch-23.12.def", "pytorch-cuda.def", "Dockerfile"])
def test_recipes_pin_the_submitit_of_the_login_node(name):
    """Tasks unpickle the job with the image's submitit: it must be the submitter's version (the task
    entry refuses a mismatch with the fix; hpctrain.launch.task)."""
    import re

    import submitit

    text = (RECIPES / name).read_text()
    assert re.findall(r'"submitit==([^"]+)"', text) == [submitit.__version__]

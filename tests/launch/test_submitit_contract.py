"""The submitit hpctrain runs is the one it was written against: the version pinned in
pyproject.toml (and the images' recipes), and every private name launch.submitit_glue overrides or
calls still there with the parameters it relies on. A submitit upgrade that moves one fails here,
naming it, instead of in a job on the cluster."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest
import submitit

from hpctrain.images.build import STAGED_PYPROJECT
from hpctrain.launch import submitit_glue

ROOT = Path(__file__).resolve().parents[2]


def pinned() -> str:
    """The version pyproject.toml's dependencies pin submitit to (`submitit==X`, the only form allowed)."""
    deps = re.search(r"^dependencies = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    pins = re.findall(r'"submitit==([^"]+)"', deps)
    assert len(pins) == 1, f"pyproject.toml: pin submitit with == in dependencies (found {deps})"
    return pins[0]


def test_the_installed_submitit_is_the_pinned_one():
    assert submitit.__version__ == pinned() == submitit_glue.VERSION
    assert f'"submitit=={pinned()}"' in STAGED_PYPROJECT  # an image built from an installed copy: the same pin


def resolve(dotted: str):
    """The object a dotted name names: the longest importable module, then attributes (a property
    is returned as itself, not called)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = inspect.getattr_static(obj, name)
        return obj
    raise ImportError(dotted)


@pytest.mark.parametrize("name", sorted(submitit_glue.CONTRACT))
def test_each_private_name_used_exists_with_its_parameters(name):
    try:
        obj = resolve(name)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"submitit {submitit.__version__} has no {name} ({e}): launch/submitit_glue.py relies on it")
    want = submitit_glue.CONTRACT[name]
    if want is None:  # an attribute (a property): its presence is the contract
        return
    params = list(inspect.signature(obj).parameters)
    assert params[: len(want)] == list(want), (
        f"{name}{inspect.signature(obj)}: launch/submitit_glue.py relies on the parameters {want}"
    )


def test_the_overrides_are_of_names_in_the_contract():
    """Every method the glue's executors override is listed (a new override cannot skip the check)."""
    base = submitit.SlurmExecutor
    for cls in (submitit_glue.ScriptExecutor, submitit_glue.ArrayExecutor):
        for name, member in vars(cls).items():
            if callable(member) and name.startswith("_") and not name.startswith("__") and hasattr(base, name):
                assert f"submitit.slurm.slurm.SlurmExecutor.{name}" in submitit_glue.CONTRACT, name

"""Test-wide set-up: import this checkout's sources (also in subprocesses and Slurm jobs)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
sys.path.insert(0, str(SRC))
os.environ["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
# Bitwise comparisons on CPU need a fixed thread count (DESIGN.md).
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _uses_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return bool(info) and any(defs and defs[-1].scope == "module" for defs in info.name2fixturedefs.values())


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """How xdist (`--dist loadgroup`) shares the tests between its workers:

    - every test on the Slurm cluster runs in one worker: one cluster per session;
    - the tests of a module that share a module-scoped fixture (a reference run, a trained model)
      stay together, so that the fixture is built once, not once per worker;
    - the Slurm tests, then the `slow` ones (minutes each) go first, so that one worker starts on
      them at once and no long test is left to run alone at the end.
    """
    slurm = [item for item in items if "slurm_cluster" in getattr(item, "fixturenames", ())]
    for item in slurm:
        item.add_marker(pytest.mark.xdist_group("slurm"))
    ids = {id(item) for item in slurm}
    rest = [item for item in items if id(item) not in ids]
    for item in rest:
        if _uses_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(f"module-{item.module.__name__}"))
    slow = [item for item in rest if item.get_closest_marker("slow")]
    ids |= {id(item) for item in slow}
    items[:] = slurm + slow + [item for item in rest if id(item) not in ids]


@pytest.fixture(scope="session")
def digits_root(tmp_path_factory) -> Path:
    """The digits dataset, written once per test session."""
    from hpctrain.data.digits import write_digits

    root = tmp_path_factory.mktemp("digits")
    write_digits(root)
    return root


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """The session's Slurm test cluster: started once, stopped at the end; skipped without root/packages."""
    from tests.slurm_cluster import SlurmCluster, missing

    why = missing()
    if why:
        pytest.skip(why)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    try:
        yield cluster
    finally:
        cluster.stop()

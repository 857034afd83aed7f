"""The session's Slurm test cluster (started once, stopped at the end; skipped without root/packages)."""

from __future__ import annotations

import pytest

from tests.slurm_cluster import SlurmCluster, missing


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    why = missing()
    if why:
        pytest.skip(why)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    try:
        yield cluster
    finally:
        cluster.stop()

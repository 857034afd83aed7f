"""Ranks and the rendezvous address from torchrun, srun or nothing."""

from __future__ import annotations

import pytest

from hpctrain.train.dist import detect, expand_hostlist, port_from_job_id


@pytest.mark.parametrize("hostlist, hosts", [
    ("n1", ["n1"]),
    ("n[1-2]", ["n1", "n2"]),
    ("gpu[01-03,7],login", ["gpu01", "gpu02", "gpu03", "gpu7", "login"]),
    ("a[8-10]-ib", ["a8-ib", "a9-ib", "a10-ib"]),
    ("x[001-002],y[1,3]", ["x001", "x002", "y1", "y3"]),
])
def test_expand_hostlist(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


def test_single_process_without_launcher():
    info = detect({})
    assert (info.rank, info.world_size, info.source) == (0, 1, "single")


def test_torchrun_variables():
    info = detect({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1234"})
    assert (info.rank, info.world_size, info.local_rank, info.master_addr, info.master_port) == (3, 8, 1, "h", 1234)
    assert info.source == "torchrun"


def test_srun_task_derives_master_from_job():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "32", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
           "SLURM_JOB_ID": "123456", "SLURM_JOB_NODELIST": "gpu[07-10]"}
    info = detect(env)
    assert (info.rank, info.world_size, info.local_rank, info.source) == (5, 32, 1, "slurm")
    assert info.master_addr == "gpu07"
    assert info.master_port == port_from_job_id("123456") == detect(dict(env, SLURM_PROCID="0")).master_port
    assert 15000 <= info.master_port < 35000
    assert detect(dict(env, MASTER_PORT="4000", MASTER_ADDR="x")).master_port == 4000


def test_batch_script_itself_is_not_a_rank():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "32", "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1"}
    assert detect(env).source == "single"

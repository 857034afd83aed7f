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
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1234",
           "TORCHELASTIC_RUN_ID": "none"}
    info = detect(env)
    assert (info.rank, info.world_size, info.local_rank, info.master_addr, info.master_port) == (3, 8, 1, "h", 1234)
    assert info.source == "torchrun"
    env.pop("TORCHELASTIC_RUN_ID")  # the same variables set by hand (tests, submitit's local executor)
    assert detect(env).source == "env" and detect(env).rank == 3


SRUN = {"SLURM_PROCID": "5", "SLURM_NTASKS": "32", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
        "SLURM_JOB_ID": "123456", "SLURM_JOB_NODELIST": "gpu[07-10]"}


def test_srun_task_derives_master_from_job():
    info = detect(SRUN)
    assert (info.rank, info.world_size, info.local_rank, info.source) == (5, 32, 1, "srun")
    assert info.master_addr == "gpu07"
    assert info.master_port == port_from_job_id("123456") == detect(dict(SRUN, SLURM_PROCID="0")).master_port
    assert 15000 <= info.master_port < 30000
    assert detect(dict(SRUN, HPCTRAIN_LAUNCHER="sbatch-script")).source == "sbatch-script"


def test_srun_task_ignores_rendezvous_variables_exported_from_the_login_shell():
    """sbatch exports the submitting shell's environment: a MASTER_ADDR/PORT or RANK left there
    (e.g. from a torchrun session) must not split the job's ranks across two rendezvous."""
    stale = dict(SRUN, MASTER_ADDR="login01", MASTER_PORT="29500", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    info = detect(stale)
    assert (info.rank, info.world_size, info.master_addr) == (5, 32, "gpu07")
    assert info.master_port == port_from_job_id("123456") != 29500


def test_array_elements_get_their_own_port():
    """Elements of one array share SLURM_ARRAY_JOB_ID but not SLURM_JOB_ID."""
    a = detect(dict(SRUN, SLURM_ARRAY_JOB_ID="900", SLURM_JOB_ID="901"))
    b = detect(dict(SRUN, SLURM_ARRAY_JOB_ID="900", SLURM_JOB_ID="902"))
    assert a.master_port != b.master_port
    ports = {port_from_job_id(j) for j in range(10**6, 10**6 + 1000)}
    assert len(ports) == 1000 and min(ports) >= 15000 and max(ports) < 30000


def test_batch_script_itself_is_not_a_rank():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "32", "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1"}
    assert detect(env).source == "single"

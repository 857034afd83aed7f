"""Ranks and the rendezvous address from torchrun, srun or nothing."""

from __future__ import annotations

import pytest

from hpctrain.train.dist import ATTEMPT_STRIDE, detect, expand_hostlist, port_from_job_id


@pytest.mark.parametrize(
    "hostlist, hosts",
    [
        ("n1", ["n1"]),
        ("n[1-2]", ["n1", "n2"]),
        ("gpu[01-03,7],login", ["gpu01", "gpu02", "gpu03", "gpu7", "login"]),
        ("a[8-10]-ib", ["a8-ib", "a9-ib", "a10-ib"]),
        ("x[001-002],y[1,3]", ["x001", "x002", "y1", "y3"]),
    ],
)
def test_expand_hostlist(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


def test_single_process_without_launcher():
    info = detect({})
    assert (info.rank, info.world_size, info.source) == (0, 1, "single")


def test_torchrun_variables():
    env = {
        "RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "h",
        "MASTER_PORT": "1234",
        "TORCHELASTIC_RUN_ID": "none",
    }
    info = detect(env)
    assert (info.rank, info.world_size, info.local_rank, info.master_addr, info.master_port) == (3, 8, 1, "h", 1234)
    assert info.source == "torchrun"
    env.pop("TORCHELASTIC_RUN_ID")  # the same variables set by hand (tests, submitit's local executor)
    assert detect(env).source == "env" and detect(env).rank == 3


SRUN = {
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "32",
    "SLURM_LOCALID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_JOB_ID": "123456",
    "SLURM_JOB_NODELIST": "gpu[07-10]",
}


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


def test_a_step_restarted_on_spares_follows_its_own_nodes_and_port():
    """Hot spares: the next step of the same job runs on other nodes (SLURM_STEP_NODELIST, not the
    job's) and moves the port on by the batch shell's attempt, away from the failed step's."""
    again = dict(SRUN, SLURM_JOB_NODELIST="gpu[07-09]", SLURM_STEP_NODELIST="gpu[08-09]", HPCTRAIN_ATTEMPT="1")
    info = detect(again)
    assert info.master_addr == "gpu08"
    assert info.master_port == port_from_job_id("123456", 1) != port_from_job_id("123456")


def test_a_requeued_job_moves_its_port_on_by_its_restart_count():
    """The previous allocation's rank 0 may still hold the port on a node that hangs: the restart
    count moves the port on as an in-job attempt does."""
    again = dict(SRUN, SLURM_RESTART_COUNT="2", HPCTRAIN_ATTEMPT="1")
    assert detect(again).master_port == port_from_job_id("123456", 3) != detect(SRUN).master_port


def test_array_elements_get_their_own_port():
    """Elements of one array share SLURM_ARRAY_JOB_ID but not SLURM_JOB_ID."""
    a = detect(dict(SRUN, SLURM_ARRAY_JOB_ID="900", SLURM_JOB_ID="901"))
    b = detect(dict(SRUN, SLURM_ARRAY_JOB_ID="900", SLURM_JOB_ID="902"))
    assert a.master_port != b.master_port
    ports = {port_from_job_id(j) for j in range(10**6, 10**6 + 1000)}
    assert len(ports) == 1000 and min(ports) >= 15000 and max(ports) < 30000


def test_a_restarted_job_never_takes_the_port_of_a_neighbouring_array_element():
    """Array elements have consecutive ids and may share a node: attempt k of job j once took job
    j+k's port (15000 + (j + k) % 15000). Now every (job, attempt) of 937 consecutive ids and 16
    attempts has a port of its own."""
    ports = [port_from_job_id(j, k) for j in range(424_242, 424_242 + ATTEMPT_STRIDE) for k in range(16)]
    assert len(set(ports)) == len(ports) and min(ports) >= 15000 and max(ports) < 30000


def test_batch_script_itself_is_not_a_rank():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "32", "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1"}
    assert detect(env).source == "single"

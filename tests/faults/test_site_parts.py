"""What real sites have and the session's test cluster leaves out (docs/sweeps.md, "Site parts"): a
Prolog that takes 15 s (a node's first step in a job waits for it), RPC rate limiting
(SlurmctldParameters=rl_enable, Slurm >= 23.02: on the 24.11 cluster), KillWait at Slurm's default
30 s, and slurmctld restarts under a running job. A 2-node × 2-task digits job lives through two
restarts: one while it trains, and one in whose downtime a rank is SIGKILLed (its srun ends the step
once the controller is back, measured; the probe steps that follow are refused for a few seconds
after a restart, and were taken for node faults before launch/shell/spares.sh asked again). Spares
whose Prolog never ran pass their probe, and a probe step waits for a node whose Prolog is still
running; a time-limit stop while the controller is down requeues.
"""

from __future__ import annotations

import os
import re
import signal
import textwrap
import time
from pathlib import Path

import pytest
import torch

from hpctrain import shellfile
from hpctrain.launch.inplace import NODE_ERE
from hpctrain.train.ckpt import checkpoint as ckpt
from tests.launch.jobs import (
    JOB_SETS,
    JOB_STEPS,
    digits_sets,
    job_report,
    metrics,
    sacct_states,
    submit,
    task_pid,
    uninterrupted,
    wait_for_step,
)
from tests.slurm_cluster import SPARE_PARTITION, SlurmCluster, slurm24_sysroot

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
SETS = (*JOB_SETS, "ckpt.every=5")
PROLOG_S = 15
# longer than Slurm's clients retry an unreachable controller (~9 s, MessageTimeout): the batch
# shell's own calls then fail unless it retries them
DOWN_S = 12
# rank 0 waits 1 s per step for data (a sleep: the arithmetic is unchanged): ~45 s of training, so that
# both restarts land mid-run however fast the machine is
SLOW_DATA = {"HPCTRAIN_TEST_DELAY": "0:1.0:data"}


@pytest.fixture(scope="module")
def site_cluster(tmp_path_factory):
    """Its own 24.11 cluster (rl_enable is not in 22.05): a 15 s Prolog, rate limiting, KillWait=30."""
    c = SlurmCluster(
        tmp_path_factory.mktemp("slurm-site-parts"),
        sysroot=slurm24_sysroot(),
        prolog_s=PROLOG_S,
        rate_limit=True,
        kill_wait=30,
    ).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def reference(digits_root, tmp_path_factory) -> dict:
    """The uninterrupted 4-rank run's final weights (local gloo ranks, same config, threads pinned)."""
    return uninterrupted(4, digits_root, tmp_path_factory)


@pytest.fixture(scope="module")
def reference2(digits_root, tmp_path_factory) -> dict:
    """The same for 2 ranks."""
    return uninterrupted(2, digits_root, tmp_path_factory)


def test_a_slurmctld_restart_mid_job_with_prolog_rate_limit_and_killwait_ends_bit_exact(
    site_cluster, digits_root, tmp_path, reference
):
    c = site_cluster
    config = c.run("scontrol", "show", "config").stdout
    assert re.search(r"SlurmctldParameters += .*rl_enable", config), config
    assert re.search(r"KillWait += 30 sec", config) and re.search(r"Prolog(\[0\])? += \S*prolog", config), config
    run = tmp_path / "site"
    started = time.time()
    job = submit(
        c, "--nodes", "2", "--gpus-per-node", "2", *digits_sets(digits_root, tmp_path, "site", *SETS), env=SLOW_DATA
    )
    wait_for_step(run, 7, 240)
    c.restart_slurmctld(down_s=DOWN_S)  # 1: while the job trains
    assert c.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING", job_report(c, job, run)
    wait_for_step(run, 22, 240)
    pid = task_pid(job, 3)  # on the second node: not the batch host
    assert pid
    c.restart_slurmctld(down_s=DOWN_S, while_down=lambda: os.kill(pid, signal.SIGKILL))  # 2: a rank dies meanwhile
    killed_at = time.time()
    assert c.wait_done(job, 600) == "COMPLETED", job_report(c, job, run)
    took = time.time() - started
    assert sacct_states(c, job) == ["COMPLETED"]  # one allocation: never requeued

    # the Prolog ran once per node of the job, and the first step on each node waited for it
    prolog = (c.root / "log" / "prolog.log").read_text()
    assert sorted(re.findall(rf"start job {job} on (\S+)", prolog)) == ["n1", "n2"], prolog
    assert sorted(re.findall(rf"end job {job} on (\S+)", prolog)) == ["n1", "n2"], prolog
    assert "RPC rate limiting enabled" in (c.root / "log" / "slurmctld.log").read_text()

    # trained through: every step recorded, one restart (the killed rank), resumed from a checkpoint
    steps = sorted({r["step"] for r in metrics(run, "train")})
    assert steps == list(range(1, JOB_STEPS + 1)), steps
    (restart,) = metrics(run, "restart")
    assert restart["nodes"] == [] and restart["attempt"] == 1 and restart["why"].startswith("exit "), restart
    batch = "".join((run / "submitit" / f"{job}_0_log.{x}").read_text() for x in ("out", "err"))
    assert "Restart 1/3 in this job on the same nodes" in batch, batch[-3000:]
    final = ckpt.load(ckpt.list_checkpoints(run)[0])
    assert final["step"] == JOB_STEPS and metrics(run, "end")[-1]["status"] == "finished"
    assert all(torch.equal(final["model"][k], v) for k, v in reference.items())
    resumed = [int(x) for x in re.findall(r"resumed from \S+ at step (\d+)", (run / "logs" / "rank-0.log").read_text())]
    print(
        f"site parts: job {job} COMPLETED {took:.0f} s after submission through 2 slurmctld restarts; the rank "
        f"killed in the second restarted {restart['decided_at'] - killed_at:.1f} s after the controller was back, "
        f"resumed at step {resumed}; probes asked again: {batch.count('refused by the controller')}"
    )


def test_spares_whose_prolog_never_ran_pass_their_probe_under_a_15_s_prolog(
    site_cluster, digits_root, tmp_path, reference2
):
    """1 training node (the batch host) and 2 spares; a rank's Python is SIGKILLed, so every node of
    the job gets a probe step (10 s timeout). A spare on which no step had run would wait out its
    15 s Prolog inside that probe and be left out as "no answer to a probe step" (it was, before
    the batch shell ran one step on its spares at the start: launch/shell/guard.sh)."""
    c = site_cluster
    run = tmp_path / "spares"
    job = submit(
        c,
        "--partition",
        SPARE_PARTITION,
        "--nodes",
        "1",
        "--spare-nodes",
        "2",
        "--gpus-per-node",
        "2",
        *digits_sets(digits_root, tmp_path, "spares", *SETS),
        env={"HPCTRAIN_TEST_DELAY": "0:0.3:data"},
    )
    wait_for_step(run, 7, 240)
    pid = task_pid(job, 1)
    assert pid
    os.kill(pid, signal.SIGKILL)
    assert c.wait_done(job, 600) == "COMPLETED", job_report(c, job, run)
    assert sacct_states(c, job) == ["COMPLETED"]
    prolog = (c.root / "log" / "prolog.log").read_text()
    assert sorted(re.findall(rf"end job {job} on (\S+)", prolog)) == ["n1", "n2", "n3"], prolog
    (restart,) = metrics(run, "restart")
    assert restart["nodes"] == [] and restart["why"].startswith("exit "), restart
    batch = "".join((run / "submitit" / f"{job}_0_log.{x}").read_text() for x in ("out", "err"))
    assert "no answer to a probe step" not in batch and "Restart 1/3 in this job on the same nodes" in batch, batch
    final = ckpt.load(ckpt.list_checkpoints(run)[0])
    assert final["step"] == JOB_STEPS
    assert all(torch.equal(final["model"][k], v) for k, v in reference2.items())


def test_a_probe_step_waits_for_a_node_whose_prolog_runs_and_names_a_check_that_hangs(site_cluster, tmp_path):
    """The batch shell's probe (launch/shell/spares.sh) of n2, a node of the job where no step has run:
    the step waits out the 15 s Prolog and the node passes (before, the 10 s timeout covered the
    Prolog too: "no answer to a probe step"). Then with an `nvidia-smi` that hangs, the step starts
    and the node is named for the hang, after HPCTRAIN_PROBE_S (3 s), not after the start's 120 s."""
    c = site_cluster
    hang = tmp_path / "hang"
    hang.mkdir()
    (hang / "nvidia-smi").write_text("#!/bin/bash\nsleep 60\n")
    (hang / "nvidia-smi").chmod(0o755)
    control = tmp_path / "control"
    control.mkdir(mode=0o700)
    values = [shellfile.assign("hpctrain_node_name", NODE_ERE), "hpctrain_job=none", "hpctrain_spares=0"]
    probe = textwrap.dedent(f"""
        t0=$SECONDS
        echo "cold: [$(hpctrain_probe n2)] $((SECONDS - t0)) s"
        t0=$SECONDS
        echo "hung: [$(PATH={shellfile.word(hang)}:$PATH hpctrain_probe n2)] $((SECONDS - t0)) s"
        """)
    script = tmp_path / "probe.sh"
    script.write_text(
        "#!/bin/bash\nhpctrain_tpn=1\n"
        + shellfile.program(["signals.sh", "slurm_call.sh", "ctld.sh", "spares.sh"], values)
        + probe
    )
    env = {"HPCTRAIN_CONTROL_DIR": str(control), "HPCTRAIN_PROBE_GPUS": "1", "HPCTRAIN_PROBE_S": "3"}
    job = c.run(
        "sbatch", "--parsable", "-p", SPARE_PARTITION, "-N2", "-w", "n1,n2", "-o", f"{script}.out", str(script), env=env
    ).stdout.strip()
    assert c.wait_done(job, 300) == "COMPLETED", Path(f"{script}.out").read_text()
    out = Path(f"{script}.out").read_text()
    cold = re.search(r"^cold: \[(.*)\] (\d+) s$", out, re.M)
    assert cold and cold[1] == "" and int(cold[2]) >= 10, out  # passed, after the Prolog (more than the old 10 s)
    hung = re.search(r"^hung: \[(.*)\] (\d+) s$", out, re.M)
    assert hung and hung[1] == "n2\tprobe step failed (exit 4): nvidia-smi -L gave no answer in 3 s", out
    assert int(hung[2]) < 60, out
    prolog = (c.root / "log" / "prolog.log").read_text()
    assert sorted(re.findall(rf"end job {job} on (\S+)", prolog)) == ["n1", "n2"], prolog


def batch_shell_pid(job: str) -> int | None:
    """The job's batch shell (slurmd runs <spool>/job<id>/slurm_script)."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                argv = (d / "cmdline").read_text().split("\0")
            except OSError:
                continue
            if any(a.endswith(f"/job{job}/slurm_script") for a in argv):
                return int(d.name)
    return None


def test_a_time_limit_stop_while_slurmctld_is_down_still_requeues(site_cluster, digits_root, tmp_path, reference):
    """The batch shell gets its time-limit USR2 (`--signal=B:USR2@…`) while the controller is down for
    20 s: the shell passes it to the tasks within 5 s (its USR2 handler does not wait for the
    controller), they checkpoint and end; srun returns once the controller is back (measured), and
    the shell requeues the job, which resumes and ends with the uninterrupted run's weights."""
    c = site_cluster
    run = tmp_path / "stop"
    job = submit(
        c, "--nodes", "2", "--gpus-per-node", "2", *digits_sets(digits_root, tmp_path, "stop", *SETS), env=SLOW_DATA
    )
    wait_for_step(run, 7, 240)
    shell = batch_shell_pid(job)
    assert shell
    # the handler asks the controller whether this is a preemption for at most 5 s, then the tasks
    # checkpoint at their next step (~1 s): well inside 20 s
    c.restart_slurmctld(down_s=20, while_down=lambda: os.kill(shell, signal.SIGUSR2))
    back_at = time.time()
    assert c.wait_done(job, 600) == "COMPLETED", job_report(c, job, run)
    assert sacct_states(c, job) == ["REQUEUED", "COMPLETED"], job_report(c, job, run)
    (stop,) = metrics(run, "stop")
    batch = "".join((run / "submitit" / f"{job}_0_log.{x}").read_text() for x in ("out", "err"))
    assert "batch shell received SIGUSR2" in batch and "requeueing job" in batch, batch[-3000:]
    final = ckpt.load(ckpt.list_checkpoints(run)[0])
    assert final["step"] == JOB_STEPS and stop["step"] < JOB_STEPS
    assert all(torch.equal(final["model"][k], v) for k, v in reference.items())
    # the tasks got the stop and checkpointed while the controller was down, not after it came back
    assert stop["time"] < back_at, (stop, back_at)

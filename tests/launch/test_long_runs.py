"""Runs that last days, on the Slurm test cluster: many time-limit windows, an admin who extends the
time limit, a suspend, a time-limit signal that never comes (docs/launch.md, "Runs that last days").

`slurm.max_requeues` is the crash-loop guard: only attempts that end without a newer checkpoint spend
it (run/requeue.py, the progress ledger). The job's end is Slurm's EndTime as it is now, re-read by the
batch shell's clock (launch/shell/clock.sh), which also stops the run when Slurm's USR2 never came.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.launch.jobs import JOB_SETS, ROOT, digits_sets, hp, job_report, metrics, sacct_states
from tests.launch.test_stop_and_requeue import (  # noqa: F401 - container, reference: the module's fixtures
    ENDED,
    assert_same_weights,
    container,
    reference,
    resumed_at,
    submit_job,
)

pytestmark = pytest.mark.slurm


def trained(run: Path) -> int:
    steps = [r["step"] for r in metrics(run, "train")]
    return steps[-1] if steps else 0


def until(cluster, job: str, run: Path, done, what: str) -> None:
    """Wait for `done()`; fail at once, with what the job did, when the job ends first."""
    wait_for(
        lambda: done() or cluster.state(job) in ENDED, f"{what} never came", 300, lambda: job_report(cluster, job, run)
    )
    assert done(), f"job {job} ended before {what}:\n{job_report(cluster, job, run)}"


def test_five_time_limit_stops_with_max_requeues_1_end_completed(
    slurm_cluster,
    container,  # noqa: F811 - the fixture imported above
    digits_root,
    tmp_path,
    reference,  # noqa: F811
):
    """slurm.max_requeues=1, and five time-limit stops (USR2 to the batch shell, as `--signal=B:USR2`
    sends it) a few steps apart: each stop checkpointed, so none spends the cap; the job is requeued
    five times and ends COMPLETED with the uninterrupted run's weights. (Before: the second stop ended
    the job FAILED, exit 3.)"""
    run = tmp_path / "five"
    prof, env = container  # rank 0 trains 0.3 s a step: the fifth stop comes well before the run's last step
    slowed = (prof, {**env, "HPCTRAIN_TEST_DELAY": "0:0.3:data"})
    job = submit_job(slurm_cluster, slowed, digits_root, tmp_path, "five", "--cluster-set", "slurm.max_requeues=1")
    try:
        last = 0
        for n in range(1, 6):
            until(slurm_cluster, job, run, lambda last=last: trained(run) >= last + 3, f"step {last + 3}")
            slurm_cluster.run("scancel", "--batch", "--signal=USR2", job)
            until(slurm_cluster, job, run, lambda n=n: len(metrics(run, "stop")) >= n, f"stop {n}")
            last = metrics(run, "stop")[-1]["step"]
        assert slurm_cluster.wait_done(job, 400) == "COMPLETED", job_report(slurm_cluster, job, run)
    finally:
        slurm_cluster.run("scancel", job, check=False)
    assert sacct_states(slurm_cluster, job) == ["REQUEUED"] * 5 + ["COMPLETED"]
    stops = metrics(run, "stop")
    assert [s["stop_kind"] for s in stops] == ["time_limit"] * 5
    assert resumed_at(run) == [s["step"] for s in stops]  # each attempt went on where the last stopped
    reqs = metrics(run, "requeue")
    assert [(r["requeue"], r["progress"], r["spent"]) for r in reqs] == [(True, True, 0)] * 5, reqs
    assert "not spent (0/1" in reqs[-1]["why"]
    assert_same_weights(run, reference)
    # the ledger: one line per attempt, each starting from the checkpoint the last one stopped with
    ledger = [line.split("\t") for line in (run / ".hpctrain" / f"progress-{job}").read_text().splitlines()]
    assert [int(a) for a, *_ in ledger] == list(range(6)) and ledger[0][1] == "-", ledger
    for (_, start, ckpts), stop in zip(ledger[1:], stops, strict=True):
        assert re.fullmatch(rf"step-0*{stop['step']}(\.pt)?", start) and ckpts == str(run / "checkpoints"), ledger


def emitted_script(cluster, profile, digits_root, tmp_path: Path, name: str, *sets: str) -> Path:
    """The stand-alone batch script `hpctrain submit --emit-sbatch` writes for the container profile,
    with a time limit of 2 min and a signal lead of 100 s: the stop is due 20 s after the start."""
    prof, env = profile
    path = tmp_path / f"{name}.sbatch"
    r = hp(
        cluster,
        "submit",
        "--config",
        "configs/digits_vit.yaml",
        "--cluster",
        str(prof),
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--cluster-set",
        "slurm.time=2",
        "--cluster-set",
        "slurm.signal_lead_s=100",
        *digits_sets(digits_root, tmp_path, name, *JOB_SETS, "ckpt.every=10", *sets),
        "--emit-sbatch",
        str(path),
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return path


def test_an_extended_time_limit_a_suspend_and_a_lost_usr2(
    slurm_cluster,
    container,  # noqa: F811 - the fixture imported above
    digits_root,
    tmp_path,
    reference,  # noqa: F811
):
    """One job, three things a run of days meets (~2 min, mostly asleep):

    - Slurm's time-limit signal is lost: the job is submitted with `--signal=B:URG@100`, which the
      batch shell ignores, as a 22.05 job whose USR2 never came;
    - an admin extends its TimeLimit from 2 to 3 min at once: the stop, due 20 s after the start by the
      first EndTime, does not come then (the job trains on past it);
    - at step 3 the job is suspended for 10 s, over twice health.hang_timeout_s (4 s): on resume no rank
      is called hung, and the stop moves by those 10 s too (Slurm adds them to EndTime).

    At the extended end less the lead, the batch shell's own clock stops the run as for a time limit: a
    checkpoint, a requeue (the attempt made progress), and the next attempt ends the run with the
    uninterrupted run's weights. Rank 0 trains 2 s a step (HPCTRAIN_TEST_DELAY) so that it is still
    training then."""
    prof, env = container
    name = "days"
    run = tmp_path / name
    script = emitted_script(slurm_cluster, container, digits_root, tmp_path, name, "health.hang_timeout_s=4")
    env = {
        **env,
        "CONTAINER": "apptainer",
        "HPCTRAIN_SOURCE": str(ROOT / "src" / "hpctrain"),
        "HPCTRAIN_TEST_DELAY": "0:2:data",
        "OMP_NUM_THREADS": "1",
    }
    job = slurm_cluster.run(
        "sbatch",
        "--parsable",
        "--signal=B:URG@100",  # Slurm's USR2, lost
        f"--partition={slurm_cluster.partition}",
        f"--output={tmp_path}/{name}-%j.out",
        str(script),
        env=env,
        cwd=tmp_path,
    ).stdout.strip()
    out = tmp_path / f"{name}-{job}.out"
    try:
        wait_for(lambda: slurm_cluster.state(job) == "RUNNING", f"job {job} did not start", 60, poll_s=0.2)
        slurm_cluster.run("scontrol", "update", f"JobId={job}", "TimeLimit=3")

        def field(key: str) -> str:
            text = slurm_cluster.run("scontrol", "show", "job", "-o", job).stdout
            return re.search(rf"\b{key}=(\S+)", text).group(1)

        start = time.mktime(time.strptime(field("StartTime"), "%Y-%m-%dT%H:%M:%S"))
        old_due = start + 120 - 100
        until(slurm_cluster, job, run, lambda: trained(run) >= 3, "step 3")
        slurm_cluster.run("scontrol", "suspend", job)
        time.sleep(10)
        slurm_cluster.run("scontrol", "resume", job)
        until(slurm_cluster, job, run, lambda: metrics(run, "stop"), "the time-limit stop")
        assert slurm_cluster.wait_done(job, 300) == "COMPLETED", job_report(slurm_cluster, job, run)
    finally:
        slurm_cluster.run("scancel", job, check=False)
    shell = out.read_text()
    assert sacct_states(slurm_cluster, job) == ["REQUEUED", "COMPLETED"], shell[-3000:]
    (stop,) = metrics(run, "stop")
    assert stop["stop_kind"] == "time_limit" and stop["time"] > old_due + 60, (stop, old_due)
    assert "and no USR2 came: stopping as for it" in shell and "received SIGUSR2" in shell, shell[-3000:]
    (req,) = metrics(run, "requeue")
    assert req["requeue"] and req["progress"], req
    assert not metrics(run, "hang") and not (run / "logs" / "hang.json").exists()
    logs = "".join((run / "logs" / f"rank-{r}.log").read_text() for r in range(2))
    assert logs.count("hang watchdog: this process did not run for") >= 2, logs[-3000:]  # both ranks saw it
    assert "the job's end moved from" in logs, logs[-3000:]
    assert resumed_at(run) == [stop["step"]]
    assert_same_weights(run, reference)
    env_rec = json.loads((run / "env.json").read_text())
    assert env_rec["env"]["SLURM_RESTART_COUNT"] == "1"

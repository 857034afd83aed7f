"""Rerunning a finished run trains nothing and writes nothing: it says the run has finished and how
to start another (before, it "resumed from step N", logged loss nan and 0 images/s, evaluated
again and saved step N a second time, in the other format when the world size differed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from hpctrain.train import compat
from hpctrain.train.entry import finished_by_this_job
from tests.helpers import digits_args


def local_submit(argv: list[str], tmp_path) -> subprocess.CompletedProcess:
    """`python <argv>` (a `submit`) with no Slurm and no cluster profile: the local executor."""
    env = {**os.environ, "SLURM_CONF": str(tmp_path / "none.conf"), "HPCTRAIN_CLUSTER": ""}
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300, env=env)


def snapshot(run):
    return {
        p.relative_to(run).as_posix(): (p.read_bytes() if p.is_file() else None)
        for p in sorted(run.rglob("*"))
        if "logs" not in p.parts and p.name != ".lock"
    }  # the job's own


@pytest.mark.slow
@pytest.mark.skipif(
    compat.version_tuple() < compat.SHARDED_MIN_TORCH,
    reason=f"sharded checkpoints need torch >= 2.4; this is {torch.__version__}",
)
def test_rerun_of_a_finished_run_trains_and_writes_nothing(digits_root, tmp_path):
    first = digits_args(digits_root, tmp_path, "done", "train.max_steps=2", "ckpt.format=sharded")
    r = subprocess.run([sys.executable, *first], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "done"
    before = snapshot(run)
    assert "checkpoints/step-00000002/.metadata" in before
    again = digits_args(digits_root, tmp_path, "done", "train.max_steps=2")  # 1 rank: single-file format
    r = subprocess.run([sys.executable, *again], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1] == (
        f"hpctrain: error: run {run} has finished: its checkpoint step-00000002 is at step 2 of 2, so there is "
        "nothing to train (nothing was written). Start another run with --set run.name=done_2, train this one "
        "again from step 0 with --set run.resume=none, or raise train.epochs (train.max_steps) to train it further"
    )
    assert "resumed from" not in r.stderr and "hpctrain summary" not in r.stderr + r.stdout
    assert snapshot(run) == before  # no second step-2 checkpoint, metrics, config.yaml or env.json rewritten
    # `submit` (here: local) refuses before it launches anything (on Slurm: before the job waits in the queue)
    submit = [a if a != "train" else "submit" for a in again]
    r = local_submit(submit, tmp_path)
    assert r.returncode == 2 and r.stderr.startswith(f"hpctrain: error: run {run} has finished"), r.stderr[-3000:]
    assert len(r.stderr.strip().splitlines()) == 1 and snapshot(run) == before
    # a lower length than the run has passed is refused there too (before, the job started and said
    # "step 2/1 (200%)" before refusing)
    lower = [a if a != "train.max_steps=2" else "train.max_steps=1" for a in submit]
    assert lower != submit
    r = local_submit(lower, tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-3000:]
    assert r.stderr.startswith(f"hpctrain: error: run {run} has finished at step 2 (checkpoint step-00000002")
    assert "would end it at step 1, which it has passed" in r.stderr and snapshot(run) == before


@pytest.mark.parametrize(
    "env, job_json, end, finished",
    [
        ({"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1"}, "7", "finished", True),  # a requeue after the end
        ({"SLURM_JOB_ID": "7", "HPCTRAIN_ATTEMPT": "2"}, "7", "finished", True),  # an in-job restart after it
        ({"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0"}, "7", "finished", False),  # the first attempt
        ({"SLURM_JOB_ID": "8", "SLURM_RESTART_COUNT": "1"}, "7", "finished", False),  # another job's run
        ({"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1"}, "7", "preempted", False),  # stopped, not ended
        ({"SLURM_RESTART_COUNT": "1"}, "7", "finished", False),  # no Slurm job
    ],
)
def test_only_a_later_attempt_of_the_job_that_finished_the_run_ends_quietly(tmp_path, env, job_json, end, finished):
    """A stop signal that comes as the last step ends (the time limit's USR2, the batch shell's clock)
    can have the job requeued or restarted once more: that attempt finds the run finished *by its own
    job* and ends with it (measured on the test cluster: before, it failed with "run … has finished",
    and the job ended FAILED after training to its end). A new submission of a finished run is still
    refused (test above)."""
    (tmp_path / "job.json").write_text(json.dumps({"job_id": job_json}))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"kind": "end", "step": 44, "status": end}) + "\n")
    assert finished_by_this_job(tmp_path, env) is finished

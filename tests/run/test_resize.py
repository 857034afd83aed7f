"""The `resize` record (run/resize.py): another world size than the attempt before, and why."""

from __future__ import annotations

import json

from hpctrain.run import resize
from hpctrain.run.layout import ENV


def test_the_previous_attempts_size_comes_from_its_env_json(tmp_path):
    assert resize.previous_size(tmp_path) is None  # a first attempt
    (tmp_path / ENV).write_text(json.dumps({"resolved": {"world_size": 6, "accum_steps": 1, "nodes": 3, "peak_lr": 1}}))
    assert resize.previous_size(tmp_path) == {"world_size": 6, "accum_steps": 1, "nodes": 3}
    (tmp_path / ENV).write_text(json.dumps({"resolved": {"world_size": 6, "accum_steps": 1}}))  # before `nodes`
    assert resize.previous_size(tmp_path) == {"world_size": 6, "accum_steps": 1}
    (tmp_path / ENV).write_text("{")
    assert resize.previous_size(tmp_path) is None


def test_a_change_of_world_size_says_why_and_the_same_size_is_no_record():
    before = {"world_size": 6, "accum_steps": 1, "nodes": 3}
    now = {"world_size": 4, "accum_steps": 1, "nodes": 2}
    env = {"SLURM_JOB_ID": "77", "HPCTRAIN_ATTEMPT": "1"}
    shrink = {"kind": "restart", "attempt": 1, "why": "n2: left the job's allocation", "fewer_nodes": True}
    other = {"kind": "restart", "attempt": 0, "why": "an older one"}
    assert resize.change(before, before, [shrink], env) is None
    assert resize.change(None, now, [shrink], env) is None
    rec = resize.change(before, now, [other, shrink], env)
    assert rec == {
        "world_size_before": 6,
        "accum_steps_before": 1,
        "nodes_before": 3,
        "world_size": 4,
        "accum_steps": 1,
        "nodes": 2,
        "job": "77",
        "why": "n2: left the job's allocation",
    }
    assert resize.text(rec) == "3 → 2 nodes (world 6 → 4, accumulation 1 → 1): n2: left the job's allocation"
    requeued = resize.change(now, before, [], {"SLURM_JOB_ID": "78", "HPCTRAIN_ATTEMPT": "0"})
    assert requeued["why"] == "a new allocation of 3 node(s) (Slurm job 78)"


def test_nodes_of_a_step():
    assert resize.nodes_of({"SLURM_STEP_NUM_NODES": "2", "SLURM_NNODES": "3"}) == 2
    assert resize.nodes_of({"SLURM_NNODES": "3"}) == 3 and resize.nodes_of({}) == 1

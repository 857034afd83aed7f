"""Resume with an incompatible config fails before anything is overwritten; a new world size
with the same global batch resumes."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from hpctrain.train.ckpt import checkpoint as ckpt
from tests.helpers import digits_args, run_ranks

SETS = ["train.max_steps=8"]


def snapshot(run):
    """Every file a refused resume must leave alone (the lock and the logs may change)."""
    files = [p for p in run.rglob("*") if p.is_file() and "logs" not in p.parts and p.name != ".lock"]
    return {p.relative_to(run): p.read_bytes() for p in files}


@pytest.mark.slow
def test_incompatible_resume_is_refused_and_nothing_changes(digits_root, tmp_path):
    run_ranks(1, digits_args(digits_root, tmp_path, "r", *SETS, "--halt-at=4"))
    run = tmp_path / "r"
    before = snapshot(run)
    for bad, why in [
        ("model.depth=5", "the model differs in model.depth"),
        ("data.global_batch=32", "the global batch was 64, now 32"),
    ]:
        r = subprocess.run(
            [sys.executable, *digits_args(digits_root, tmp_path, "r", *SETS, bad)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 2, r.stdout + r.stderr
        assert "cannot resume from" in r.stderr and why in r.stderr, r.stderr
        assert snapshot(run) == before  # config.yaml, metrics, checkpoints untouched


@pytest.mark.slow
def test_new_world_size_same_global_batch_resumes(digits_root, tmp_path):
    run_ranks(1, digits_args(digits_root, tmp_path, "r", *SETS, "--halt-at=4"))
    out = run_ranks(2, digits_args(digits_root, tmp_path, "r", *SETS))
    assert "at step 4" in out[0].stdout and re.search(r"status +finished", out[0].stdout)
    newest = ckpt.list_checkpoints(tmp_path / "r")[0]
    assert ckpt.step_of(newest) == 8 and ckpt.is_sharded(newest)  # ckpt.format=auto: sharded for 2 ranks

"""Sharded (DCP) checkpoints: resume at another world size with the same weights and optimizer
state; a kill or a full disk during a background save leaves the previous checkpoint as `latest`."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
import torch

from hpctrain.train import compat
from hpctrain.train.ckpt import checkpoint as ckpt
from tests.faults.local import start_ranks
from tests.helpers import DIGITS, digits_args, run_ranks

pytestmark = pytest.mark.skipif(
    compat.version_tuple() < compat.SHARDED_MIN_TORCH,
    reason=f"sharded checkpoints need torch >= 2.4; this is {torch.__version__}",
)

SETS = ["train.max_steps=4", "train.ema=0.9", "ckpt.format=sharded", "aug.mixup=0.8", "data.global_batch=16"]


def assert_tensors_equal(a, b, what: str) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), what
        for k in a:
            assert_tensors_equal(a[k], b[k], f"{what}.{k}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), what
    else:
        assert a == b, what


@pytest.mark.slow
@pytest.mark.parametrize(("before", "after"), [(2, 4), (4, 2)])
def test_resume_at_another_world_size(before, after, digits_root, tmp_path):
    run_ranks(before, digits_args(digits_root, tmp_path, "r", *SETS, "--halt-at=2"))
    run = tmp_path / "r"
    (saved,) = ckpt.list_checkpoints(run)
    assert ckpt.is_sharded(saved) and ckpt.step_of(saved) == 2
    assert len(list(saved.glob("*.distcp"))) >= 1 and (run / "checkpoints" / "latest").read_text().strip() == saved.name
    want = ckpt.load(saved)
    sets = [a.removeprefix("--set=") for a in digits_args(digits_root, tmp_path, "r", *SETS)[5:] if a != "--set"]
    outs = run_ranks(after, ["-m", "tests.train.ckpt.resume_worker", str(DIGITS), str(run), *sets])
    for r in range(after):
        got = torch.load(run / f"loaded-{r}.pt", weights_only=True)
        assert got["step"] == 2
        assert_tensors_equal(got["model"], want["model"], "model")
        assert_tensors_equal(got["ema"], want["ema"], "ema")
        assert_tensors_equal(got["optimizer"]["state"], want["optimizer"]["state"], "optimizer")
        assert re.search(rf"rank {r}: finished at step 4 from 2, loss \d", outs[r].stdout), outs[r].stdout[-2000:]
    final = ckpt.list_checkpoints(run)[0]
    assert ckpt.step_of(final) == 4 and ckpt.load(final)["world_size"] == after


def wait_for(cond, procs, timeout=120, poll=0.002):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "timed out"
        assert all(p.poll() is None for p in procs), procs[0].communicate()[0][-3000:]
        time.sleep(poll)


def test_sigkill_during_background_save_keeps_previous(digits_root, tmp_path):
    # A wider model (~13 M parameters: ~150 MB with AdamW and EMA) makes each save take long
    # enough to be caught in flight (the temp directory the ranks write into exists); a small batch
    # keeps the steps short.
    sets = [
        "train.max_steps=200",
        "ckpt.every=3",
        "ckpt.async_save=true",
        "model.width=512",
        "model.heads=8",
        "model.depth=4",
        "aug.mixup=0",
        "data.global_batch=8",
    ]
    procs = start_ranks(1, digits_root, tmp_path, "k", *sets)
    d = ckpt.ckpt_dir(tmp_path / "k")
    first, second = d / ckpt.name(3, "sharded"), d / f".{ckpt.name(6, 'sharded')}.tmp"
    try:
        wait_for(first.is_dir, procs)
        wait_for(second.is_dir, procs)
        assert not (d / ckpt.name(6, "sharded")).exists()  # still in flight
        os.kill(procs[0].pid, signal.SIGKILL)
        procs[0].wait()
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    assert (d / "latest").read_text().strip() == first.name
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "k")] == [first.name]
    path, st = ckpt.find_resume(tmp_path / "k", "auto")
    assert path == first and st["step"] == 3
    # the resumed run goes on from step 3 and clears the half-written directory at its first save
    out = run_ranks(1, digits_args(digits_root, tmp_path, "k", *sets, "train.max_steps=4"))
    assert "at step 3" in out[0].stdout
    assert not list(d.glob(".*.tmp")) and ckpt.step_of(ckpt.list_checkpoints(tmp_path / "k")[0]) == 4

"""Exact resume: N steps in one go equal N/2, stop, resume, N/2 — bit for bit (one file for one
rank, sharded DCP checkpoints for several where torch has them: ckpt.format=auto)."""

from __future__ import annotations

import pytest
import torch

from hpctrain.train import compat
from hpctrain.train.ckpt import checkpoint as ckpt
from tests.helpers import digits_args, run_ranks

# Mid-epoch halt (22 steps/epoch at batch 64), mixup+cutmix, drop-path and EMA all on: every piece
# of state that a resume must restore is exercised. DDP as configured by default (static_graph on:
# dist.ddp_static_graph=auto with train.accum_steps=1); gradient accumulation has its own case.
SETS = [
    "train.max_steps=30",
    "aug.mixup=0.8",
    "aug.cutmix=1.0",
    "model.drop_path=0.1",
    "train.ema=0.9",
    "optim.warmup_steps=5",
]


def final_state(run_dir):
    path = ckpt.list_checkpoints(run_dir)[0]
    return ckpt.load(path)


def assert_same(a: dict, b: dict) -> None:
    assert a["step"] == b["step"]
    for part in ("model", "ema"):
        assert a[part].keys() == b[part].keys()
        for k in a[part]:
            assert torch.equal(a[part][k], b[part][k]), f"{part}.{k} differs"
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    for k in sa:
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(sa[k][name], sb[k][name]), f"optimizer state {k}.{name} differs"


def halt_and_resume(world: int, sets: list[str], root, tmp_path) -> None:
    """Run `sets` straight through, then halted at step 13 and resumed: the final states must be equal."""
    run_ranks(world, digits_args(root, tmp_path, "straight", *sets, "run.resume=none"))
    run_ranks(world, digits_args(root, tmp_path, "split", *sets, "--halt-at=13"))
    halted = ckpt.list_checkpoints(tmp_path / "split")
    assert [ckpt.step_of(p) for p in halted] == [13]
    assert ckpt.is_sharded(halted[0]) == (world > 1 and compat.version_tuple() >= compat.SHARDED_MIN_TORCH)
    out = run_ranks(world, digits_args(root, tmp_path, "split", *sets))
    assert "resumed from" in out[0].stdout and "at step 13" in out[0].stdout
    assert_same(final_state(tmp_path / "straight"), final_state(tmp_path / "split"))


# 1 rank: one checkpoint file; 4 ranks: sharded checkpoints, and DDP's bucket layout decides the order
# of every sum. No 2-rank case: with 2 a sum is order-free (a + b = b + a), so it shows nothing the
# 4-rank case does not, and the 2-rank resume runs in the background-save and DeiT cases below and
# in every Slurm stop test (2 nodes × 1 task).
@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 4])
def test_halt_and_resume_equals_uninterrupted(world, digits_root, tmp_path):
    halt_and_resume(world, SETS, digits_root, tmp_path)


@pytest.mark.slow
def test_halt_and_resume_equals_uninterrupted_with_accumulation(digits_root, tmp_path):
    """train.accum_steps=2: no_sync micro-steps, static_graph off (dist.ddp_static_graph=auto)."""
    halt_and_resume(4, [*SETS, "train.accum_steps=2"], digits_root, tmp_path)


# DeiT-B's data and schedule options (configs/vit_b16_imagenet.yaml): repeated augmentation (20 steps
# per epoch here: ⌊1438/256⌋·256 / 64), random erasing, bicubic, per-epoch lr from warmup_lr, cool-down.
DEIT_SETS = [
    "aug.repeated_aug=3",
    "aug.erase_prob=0.25",
    "data.interpolation=bicubic",
    "optim.warmup_lr=1e-6",
    "optim.lr_update=epoch",
    "optim.cooldown_epochs=0.5",
    "train.epochs=2",
    "train.max_steps=22",
]


@pytest.mark.slow
def test_halt_and_resume_equals_uninterrupted_with_deit_options(digits_root, tmp_path):
    sets = [*SETS, *DEIT_SETS]
    run_ranks(2, digits_args(digits_root, tmp_path, "straight", *sets, "run.resume=none"))
    run_ranks(2, digits_args(digits_root, tmp_path, "split", *sets, "--halt-at=13"))
    out = run_ranks(2, digits_args(digits_root, tmp_path, "split", *sets))
    assert "resumed from" in out[0].stdout and "at step 13" in out[0].stdout
    assert_same(final_state(tmp_path / "straight"), final_state(tmp_path / "split"))


@pytest.mark.slow
def test_resume_from_a_background_save_equals_uninterrupted(digits_root, tmp_path):
    """ckpt.async_save=true, 2 ranks: step 10's checkpoint, written in the background by
    dcp.async_save on a gloo group of its own, resumes (run.resume=<its path>) to the final state
    of the run straight through, tensor for tensor."""
    if compat.version_tuple() < compat.SHARDED_MIN_TORCH:
        pytest.skip(f"background saves need torch >= 2.4; this is {torch.__version__}")
    sets = [*SETS, "ckpt.async_save=true", "ckpt.every=10"]
    run_ranks(2, digits_args(digits_root, tmp_path, "straight", *sets, "run.resume=none"))
    run_ranks(2, digits_args(digits_root, tmp_path, "split", *sets, "--halt-at=13"))
    (step10,) = [p for p in ckpt.list_checkpoints(tmp_path / "split") if ckpt.step_of(p) == 10]
    assert ckpt.is_sharded(step10)
    out = run_ranks(2, digits_args(digits_root, tmp_path, "split", *sets, f"run.resume={step10}"))
    assert "resumed from" in out[0].stdout and "at step 10" in out[0].stdout
    assert_same(final_state(tmp_path / "straight"), final_state(tmp_path / "split"))

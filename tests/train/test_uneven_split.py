"""A global batch split unevenly over the ranks (data.sampling.rank_share) trains the same step as one
rank: the loss weight b_r·W/g makes DDP's equal-weight average the global batch's mean gradient, and
log.sample_hashes shows the same samples. The even split keeps its loss as it was (no factor)."""

from __future__ import annotations

import pytest
import torch

from hpctrain.run.layout import SAMPLE_HASHES
from hpctrain.run.sample_hashes import read_last
from tests.helpers import DIGITS, run_ranks

WORKER = ["-m", "tests.train.step_worker"]
# One plain SGD step (no momentum, decay, clipping or warm-up): the update is -lr × the gradient, so the
# weights' change compares the gradients. No mixup or drop-path: they depend on the rank's batch.
SETS = [
    "train.max_steps=1",
    "optim.name=sgd",
    "optim.lr=0.5",
    "optim.momentum=0",
    "optim.weight_decay=0",
    "optim.clip_grad=0",
    "optim.warmup_epochs=0",
    "aug.mixup=0",
    "aug.cutmix=0",
    "model.drop_path=0",
    "log.every=1",
    "log.sample_hashes=true",
    "train.eval_every_epochs=0",
    "ckpt.every=0",
    "train.threads=1",
]
# measured (CPU, 1 thread): world 3 (22, 21, 21 of 64) against world 1, max |Δ3 - Δ1| / max |Δ1| over the
# tensors 3.7e-7, world 2 2.0e-7 (float32 sums in another order); without the loss weight world 3 is 2.4e-2
RTOL = 1e-5


def run(world, digits_root, out, *sets):
    out.mkdir()
    run_ranks(world, [*WORKER, str(DIGITS), str(out), f"data.root={digits_root}", f"run.dir={out}", *SETS, *sets])
    return [torch.load(out / f"step-{r}.pt", weights_only=True) for r in range(world)]


def update(rank_file: dict) -> dict[str, torch.Tensor]:
    return {k: rank_file["after"][k] - v for k, v in rank_file["before"].items()}


def worst(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-30)) for k in b)


@pytest.mark.slow
def test_uneven_world_trains_the_one_rank_step_and_even_keeps_no_factor(digits_root, tmp_path):
    one = run(1, digits_root, tmp_path / "one")
    three = run(3, digits_root, tmp_path / "three")
    two = run(2, digits_root, tmp_path / "two")
    assert [f["loss_weight"] for f in three] == pytest.approx([22 * 3 / 64, 21 * 3 / 64, 21 * 3 / 64])
    assert one[0]["loss_weight"] is None and [f["loss_weight"] for f in two] == [None, None]  # even: no multiply
    for r in (1, 2):
        assert all(torch.equal(three[0]["after"][k], v) for k, v in three[r]["after"].items())  # ranks agree
    base = update(one[0])
    assert any(v.abs().max() > 1e-3 for v in base.values())  # the step moved the weights
    err = worst(update(three[0]), base)
    assert err < RTOL, err
    assert worst(update(two[0]), base) < RTOL
    hashes = [read_last(tmp_path / name / SAMPLE_HASHES) for name in ("one", "two", "three")]
    assert hashes[0] == hashes[1] == hashes[2] and hashes[0][1]["n"] == 64 and hashes[0][1]["epoch"] == 0

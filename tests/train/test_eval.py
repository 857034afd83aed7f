"""Evaluation is exact under DDP: the same top-1 for 1 and 3 ranks on a val set 3 does not divide."""

from __future__ import annotations

import json

import pytest
import torch

from hpctrain.config import load
from hpctrain.models.vit import build_vit
from tests.helpers import DIGITS, digits_args, hpctrain, run_ranks


@pytest.mark.slow
def test_eval_same_for_world_1_and_3(digits_root, tmp_path):
    run_ranks(1, digits_args(digits_root, tmp_path, "trained", "train.max_steps=8"))
    out = {}
    for world in (1, 3):  # the trained weights evaluated by 1 and by 3 ranks (a finished run is not resumed)
        # 17 a batch: 359 images are 120, 120 and 119 a rank, 8, 8 and 7 batches (rank 2 pads one forward)
        run_ranks(
            world,
            [
                "-m",
                "hpctrain",
                "eval",
                str(tmp_path / "trained"),
                "-o",
                str(tmp_path / f"w{world}"),
                "--set",
                "data.eval_batch_per_rank=17",
            ],
        )
        out[world] = json.loads((tmp_path / f"w{world}" / "summary.json").read_text())
    e1, e3 = out[1], out[3]
    assert e1["count"] == e3["count"] == 359  # not divisible by 3: no sample dropped or doubled
    assert e1["top1"] == e3["top1"] and e1["top5"] == e3["top5"]
    assert 10.0 < e1["top1"] < 100.0
    assert abs(e1["loss"] - e3["loss"]) < 1e-6


@pytest.mark.slow
def test_eval_of_a_weights_file_writes_beside_it_not_into_the_working_directory(digits_root, tmp_path):
    weights = tmp_path / "w" / "digits.pt"
    weights.parent.mkdir()
    torch.manual_seed(0)
    torch.save(build_vit(load(DIGITS).model).state_dict(), weights)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    r = hpctrain(
        "eval",
        "--weights",
        str(weights),
        "--config",
        str(DIGITS),
        "--data",
        str(digits_root),
        "--set",
        "train.threads=1",
        cwd=cwd,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((tmp_path / "w" / "digits.pt.eval" / "summary.json").read_text())["count"] == 359
    assert list(cwd.iterdir()) == []

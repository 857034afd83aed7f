"""Evaluation is exact under DDP: the same top-1 for 1 and 2 ranks on an odd-sized val set."""

from __future__ import annotations

import shutil

from tests.helpers import digits_args, run_metrics, run_ranks


def last_eval(run_dir) -> dict:
    return run_metrics(run_dir, "eval")[-1]


def test_eval_same_for_world_1_and_2(digits_root, tmp_path):
    sets = ["train.max_steps=8"]
    run_ranks(1, digits_args(digits_root, tmp_path, "trained", *sets))
    for name in ("w1", "w2"):  # resume the finished run: it only evaluates the same weights
        shutil.copytree(tmp_path / "trained", tmp_path / name)
        (tmp_path / name / "metrics.jsonl").unlink()
    run_ranks(1, digits_args(digits_root, tmp_path, "w1", *sets))
    run_ranks(2, digits_args(digits_root, tmp_path, "w2", *sets))
    e1, e2 = last_eval(tmp_path / "w1"), last_eval(tmp_path / "w2")
    assert e1["count"] == e2["count"] == 359  # not divisible by 2: no sample dropped or doubled
    assert e1["top1"] == e2["top1"] and e1["top5"] == e2["top5"]
    assert 10.0 < e1["top1"] < 100.0
    assert abs(e1["loss"] - e2["loss"]) < 1e-6

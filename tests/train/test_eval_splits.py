"""data.eval_splits: several eval splits in one run (big_vision's evals on val and minival), each
evaluated once per eval, logged under its own keys in metrics.jsonl and its own TensorBoard tags; one
split keeps the names it always had."""

from __future__ import annotations

import pytest

from hpctrain.config import ConfigError, load
from hpctrain.data.folder import list_split, minival_split
from hpctrain.train import evaluator
from hpctrain.train.entry import run as train
from tests.helpers import run_metrics
from tests.train.observe.test_tensorboard import EPOCH, digits, read_tb

FIELDS = ("top1", "top5", "loss", "count")


@pytest.mark.slow
def test_two_splits_each_evaluated_once_and_logged_under_its_name(digits_root, tmp_path, monkeypatch):
    calls = []
    real = evaluator.evaluate

    def spy(model, loader, *a, **k):
        calls.append(id(loader))
        return real(model, loader, *a, **k)

    monkeypatch.setattr(evaluator, "evaluate", spy)
    cfg = digits(
        digits_root,
        tmp_path,
        f"train.max_steps={EPOCH + 1}",
        "train.eval_every_epochs=1",
        "train.ema=0.9",
        "log.trackers=[tensorboard]",
        "data.eval_splits=[val,minival]",
    )
    train(cfg)
    run = tmp_path / "r"
    evals = run_metrics(run, "eval")
    assert [r["step"] for r in evals] == [EPOCH, EPOCH + 1]  # one record per eval (epoch end, last step)
    n_val = len(list_split(digits_root, "val"))
    n_mini = len(minival_split(list_split(digits_root, "train"))[1])
    for rec in evals:
        for split, n in (("val", n_val), ("minival", n_mini)):
            assert rec[f"{split}/count"] == rec[f"{split}/ema_count"] == n
            assert all(f"{split}/{k}" in rec and f"{split}/ema_{k}" in rec for k in FIELDS)
        assert all(rec[k] == rec[f"val/{k}"] and rec[f"ema_{k}"] == rec[f"val/ema_{k}"] for k in FIELDS)  # headline
    assert evals[-1]["val/top1"] != evals[-1]["minival/top1"] or n_val != n_mini  # two different sets
    # per eval: val and minival once each, for the model and for the EMA; 2 evals
    assert len(calls) == 8 and len(set(calls)) == 2 and all(calls.count(c) == 4 for c in set(calls))

    acc = read_tb(run / "tb")
    tags = set(acc.Tags()["scalars"])
    for split in ("val", "minival"):
        for k in ("top1", "top5", "loss", "ema_top1"):
            points = acc.Scalars(f"eval/{split}/{k}")
            assert [p.step for p in points] == [EPOCH, EPOCH + 1]
            assert [p.value for p in points] == pytest.approx([r[f"{split}/{k}"] for r in evals], rel=1e-6)
    assert {"eval/top1", "eval/ema_top1"} <= tags  # the headline under the names report/plots read


def test_one_split_keeps_its_names(digits_root, tmp_path):
    train(digits(digits_root, tmp_path, "train.max_steps=1", "log.trackers=[]", "data.eval_splits=[minival]"))
    (rec,) = run_metrics(tmp_path / "r", "eval")
    assert set(FIELDS) <= set(rec) and not any("/" in k for k in rec)
    assert rec["count"] == len(minival_split(list_split(digits_root, "train"))[1])


@pytest.mark.parametrize(
    "sets, match",
    [
        (["data.eval_splits=[val,test]"], "'test' is not a split"),
        (["data.eval_splits=[val,val]"], "names a split twice"),
        (["data.eval_splits=[val,minival]", "data.val_split=minival"], "both choose the eval split"),  # 0.1.0's key
        (["data.eval_splits=[]"], "data.eval_splits is empty"),
    ],
)
def test_bad_eval_splits_are_refused(sets, match):
    with pytest.raises(ConfigError, match=match):
        load(None, sets)


def test_s16_recipe_evaluates_minival_and_val_as_big_vision():
    """big_vision vit_s16_i1k.py:99-100: evals.minival (train[99%:]) and evals.val (validation); minival
    is the headline (the recipe monitors it), trained on the other 99 %."""
    d = load("configs/vit_s16_imagenet_90ep.yaml").data
    assert d.eval_splits == ("minival", "val")

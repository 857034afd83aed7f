"""train.evaluator: which steps evaluate, and the best score that ckpt.keep_best keeps."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from hpctrain.run.metrics import MetricsWriter
from hpctrain.train.evaluator import Evaluator
from hpctrain.train.state import TrainState


def evaluator(keep_best: bool = True, every: int = 2) -> Evaluator:
    cfg = SimpleNamespace(
        ckpt=SimpleNamespace(keep_best=keep_best),
        train=SimpleNamespace(eval_every_epochs=every, amp="none"),
        data=SimpleNamespace(eval_splits=["val"]),
    )
    return Evaluator(cfg, torch.device("cpu"), None, MetricsWriter(None), is_main=True)


def test_every_other_epoch_evaluates_and_the_last_step_is_left_to_the_end():
    ev = evaluator(every=2)
    assert [s for s in range(1, 41) if ev.due(s, steps_per_epoch=5, total_steps=40)] == [10, 20, 30]
    assert not any(evaluator(every=0).due(s, 5, 40) for s in range(1, 41))


def test_only_a_better_top1_is_the_best_and_only_with_keep_best():
    ev, st = evaluator(), TrainState()
    assert ev.best({"top1": 50.0}, 10, st) and st.best == (50.0, 10)
    assert not ev.best({"top1": 50.0}, 20, st) and not ev.best({"top1": 40.0}, 30, st)
    assert ev.best({"top1": 60.0}, 40, st) and st.best == (60.0, 40)
    assert not ev.best({}, 50, st)  # no headline split: nothing to compare
    off = TrainState()
    assert not evaluator(keep_best=False).best({"top1": 99.0}, 10, off) and off.best is None

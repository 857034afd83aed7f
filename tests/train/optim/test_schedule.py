"""The learning-rate schedule against timm's CosineLRScheduler as DeiT's main.py drives it.

The reference below is transcribed from timm 0.3.x (the version DeiT pins, requirements.txt
timm==0.3.2): timm/scheduler/cosine_lr.py `_get_lr` with t_mul=1, cycle_limit=1 (scheduler_factory.py
create_scheduler), and DeiT main.py's loop: the scheduler sets warmup_lr_init at construction, then
`lr_scheduler.step(epoch)` runs after each epoch (main.py:432) for epochs range(args.epochs) (main.py:420).
"""

from __future__ import annotations

import math

import pytest

from hpctrain.config import ConfigError, load
from hpctrain.train.optim.build import lr_schedule


def timm_get_lr(
    t: float, base: float, warmup_t: float, warmup_lr_init: float, t_initial: float, lr_min: float
) -> float:
    if t < warmup_t:
        return warmup_lr_init + t * (base - warmup_lr_init) / warmup_t
    i = t // t_initial
    if i < 1:  # cycle_limit 1
        return lr_min + 0.5 * (base - lr_min) * (1 + math.cos(math.pi * (t - t_initial * i) / t_initial))
    return lr_min


def deit_epoch_lrs(epochs: int, **kw) -> list[float]:
    """The lr each epoch of DeiT's main loop trains at."""
    lr = kw["warmup_lr_init"]  # CosineLRScheduler.__init__: update_groups(warmup_lr_init)
    out = []
    for epoch in range(epochs):
        out.append(lr)  # train_one_epoch
        lr = timm_get_lr(epoch, **kw)  # lr_scheduler.step(epoch)
    return out


def test_epoch_updates_follow_deit_and_timm():
    spe, epochs = 7, 30
    cfg = load(
        data={
            "optim": {"lr": 1e-3, "warmup_epochs": 5, "warmup_lr": 1e-6, "min_lr": 1e-5, "lr_update": "epoch"},
            "train": {"epochs": epochs},
        }
    )
    lr = lr_schedule(cfg, spe, epochs * spe)
    want = deit_epoch_lrs(epochs, base=1e-3, warmup_t=5, warmup_lr_init=1e-6, t_initial=epochs, lr_min=1e-5)
    got = [[lr(e * spe + i) for i in range(spe)] for e in range(epochs)]
    for e in range(epochs):
        assert got[e] == pytest.approx([want[e]] * spe, rel=1e-12, abs=0), f"epoch {e}"
    assert got[0][0] == got[1][0] == 1e-6  # the one-epoch lag of step(epoch) after the epoch
    assert max(want) < 1e-3  # DeiT never trains at the peak itself


def test_cooldown_holds_min_lr_after_the_cosine():
    """timm train.py: cosine over t_initial epochs, then cooldown epochs at lr_min (per epoch here)."""
    spe, epochs, cool = 4, 20, 5
    cfg = load(
        data={
            "optim": {
                "lr": 2e-3,
                "warmup_epochs": 3,
                "warmup_lr": 1e-6,
                "min_lr": 1e-5,
                "cooldown_epochs": cool,
                "lr_update": "epoch",
            },
            "train": {"epochs": epochs},
        }
    )
    lr = lr_schedule(cfg, spe, epochs * spe)
    want = deit_epoch_lrs(epochs, base=2e-3, warmup_t=3, warmup_lr_init=1e-6, t_initial=epochs - cool, lr_min=1e-5)
    assert [lr(e * spe) for e in range(epochs)] == pytest.approx(want, rel=1e-12, abs=0)
    # timm's lr reaches lr_min at epoch 15; DeiT's one-epoch lag trains epochs 16..19 there
    assert want[-(cool - 1) :] == [1e-5] * (cool - 1) and want[-cool] > 1e-5


def test_per_step_warmup_starts_at_warmup_lr_and_cools_down():
    """Per-step: timm's formula with t = update count (t_in_epochs=False), warm-up from warmup_lr_init."""
    total, warm, cool = 100, 10, 20
    cfg = load(
        data={
            "optim": {"lr": 1e-3, "warmup_steps": warm, "warmup_lr": 1e-6, "min_lr": 1e-5, "cooldown_epochs": 2},
            "train": {"epochs": 10},
        }
    )
    lr = lr_schedule(cfg, 10, total)
    for s in range(warm):  # step s trains after s+1 updates of the warm-up line
        assert lr(s) == pytest.approx(1e-6 + (s + 1) * (1e-3 - 1e-6) / warm, rel=1e-12)
    for s in range(warm, total - cool):
        t = (s - warm) / (total - cool - warm)
        assert lr(s) == pytest.approx(1e-5 + 0.5 * (1e-3 - 1e-5) * (1 + math.cos(math.pi * t)), rel=1e-12)
    assert [lr(s) for s in range(total - cool, total)] == [1e-5] * cool


def test_default_schedule_is_unchanged():
    cfg = load(data={"optim": {"lr": 1e-3, "warmup_steps": 4, "min_lr": 0.0}, "train": {"epochs": 2}})
    lr = lr_schedule(cfg, 8, 16)
    assert [lr(s) for s in range(4)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert lr(15) == pytest.approx(0.5e-3 * (1 + math.cos(math.pi * 11 / 12)))


def test_cooldown_longer_than_training_is_refused():
    cfg = load(data={"optim": {"cooldown_epochs": 3}, "train": {"epochs": 3}})
    with pytest.raises(ConfigError, match="cooldown_epochs"):
        lr_schedule(cfg, 5, 15)

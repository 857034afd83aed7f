"""build_optimizer builds what optim.name's OptimSpec names: each shipped spec's builder makes its
optimizer over the parameter groups, and an optimizer added as a spec in a test (its builder here)
is built, estimated and checked by the config without any other file knowing it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hpctrain import memory
from hpctrain.config import load
from hpctrain.errors import UserError
from hpctrain.models.vit import ViT
from hpctrain.optim_spec import OPTIMIZERS, OptimSpec
from hpctrain.train.optim.adamw import AdamWLowMu
from hpctrain.train.optim.build import build_optimizer
from hpctrain.train.optim.lamb import Lamb
from tests.helpers import DIGITS


class Fake(torch.optim.SGD):
    """A new optimizer: SGD with two state buffers per parameter (12 bytes with its momentum)."""


def build_fake(cfg, groups, device):
    return Fake(groups, lr=cfg.peak_lr)


def tiny() -> ViT:
    return ViT(img_size=16, patch_size=8, depth=2, width=32, heads=2, num_classes=5)


@pytest.mark.parametrize(
    "sets, kind",
    [
        ([], torch.optim.AdamW),
        (["optim.mu_dtype=bf16"], AdamWLowMu),
        (["optim.name=lamb"], Lamb),
        (["optim.name=sgd"], torch.optim.SGD),
    ],
)
def test_each_spec_builds_its_optimizer(sets, kind):
    cfg = load(DIGITS, sets)
    opt = build_optimizer(cfg, tiny(), torch.device("cpu"))
    assert type(opt) is kind and [g["weight_decay"] for g in opt.param_groups] == [cfg.optim.weight_decay, 0.0]
    assert opt.param_groups[0]["lr"] == cfg.peak_lr


def test_an_optimizer_added_as_a_spec_is_built_and_estimated_by_its_own_figure(monkeypatch):
    adam = load(DIGITS, ["train.ema=0"])
    monkeypatch.setitem(OPTIMIZERS, "fake", OptimSpec("fake", "Fake", f"{__name__}:build_fake", lambda o: 12))
    cfg = load(DIGITS, ["optim.name=fake", "train.ema=0"])
    assert type(build_optimizer(cfg, tiny(), torch.device("cpu"))) is Fake
    trainable = memory.param_count(cfg.model).trainable
    assert memory.estimate(cfg, 8).optimizer == 12 * trainable != memory.estimate(adam, 8).optimizer
    assert memory.checkpoint_bytes(cfg) - memory.checkpoint_bytes(adam) == (12 - 8) * trainable


def test_an_optimizer_without_a_spec_is_not_estimated_as_adam():
    """A config built around the loader (no choices check) still cannot price an unknown optimizer."""
    cfg = load(DIGITS)
    lars = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, name="lars"))
    with pytest.raises(UserError, match="optim.name='lars' is not an optimizer hpctrain knows: use one of adamw"):
        memory.estimate(lars, 8)

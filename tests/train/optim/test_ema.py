"""EMA of the weights (train/optim/ema.py): the cached tensor lists give the old two-`state_dict()` update
bit for bit, and follow the live tensors after a load that replaces them."""

from __future__ import annotations

import copy

import torch

from hpctrain.train.optim.ema import EMA

DECAY = 0.9


class Counting(torch.nn.Module):
    """A small model with a float and an integer buffer that counts its state_dict() calls."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 4)
        self.norm = torch.nn.BatchNorm1d(4)  # running stats (float) and num_batches_tracked (int)
        self.calls = 0

    def state_dict(self, *args, **kwargs):
        self.calls += 1
        return super().state_dict(*args, **kwargs)


def old_update(ema_module: torch.nn.Module, model: torch.nn.Module) -> None:
    """The update before the cache: two state_dict() calls per step."""
    with torch.no_grad():
        ema = list(ema_module.state_dict().values())
        src = list(model.state_dict().values())
        floats = [(e, s) for e, s in zip(ema, src) if e.is_floating_point()]
        torch._foreach_lerp_([e for e, _ in floats], [s.float() for _, s in floats], 1.0 - DECAY)


def train_step(model: torch.nn.Module, gen: torch.Generator) -> None:
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.add_(torch.randn(t.shape, generator=gen))


def test_cached_update_equals_the_state_dict_one_bit_for_bit_and_calls_no_state_dict():
    torch.manual_seed(0)
    model = Counting()
    ema, ref = EMA(model, DECAY), copy.deepcopy(model).float()
    gen = torch.Generator().manual_seed(1)
    for step in range(20):
        train_step(model, gen)
        model.calls = 0
        ema.update(model)
        assert model.calls == (1 if step == 0 else 0)  # the lists are built once
        old_update(ref, model)
    for (k, a), b in zip(ema.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), k


def test_cache_follows_tensors_a_load_replaces():
    torch.manual_seed(0)
    model, gen = Counting(), torch.Generator().manual_seed(2)
    ema = EMA(model, DECAY)
    ref = copy.deepcopy(ema.module)
    ema.update(model)
    old_update(ref, model)
    # a resume that puts new tensors into both models (assign=True, as DCP's loaders may)
    new = {k: v.clone() + 1 if v.is_floating_point() else v.clone() for k, v in model.state_dict().items()}
    old_weight = model.lin.weight
    model.load_state_dict(new, assign=True)
    assert model.lin.weight is not old_weight
    ema_new = {k: v.clone() for k, v in ema.state_dict().items()}
    ema.module.load_state_dict(ema_new, assign=True)
    ref.load_state_dict(ema_new)
    for _ in range(5):
        train_step(model, gen)
        ema.update(model)
        old_update(ref, model)
    for (k, a), b in zip(ema.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), k
    # and the EMA's own loader (in place) with a resumed checkpoint's EMA
    ema.load_state_dict(ref.state_dict())
    train_step(model, gen)
    ema.update(model)
    old_update(ref, model)
    for (k, a), b in zip(ema.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), k

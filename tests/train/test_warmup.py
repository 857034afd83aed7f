"""train.warmup.warm_compile in one process (a gloo group of one): it compiles the forward and the
backward through DDP, and leaves RNG streams, gradients and weights as they were."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as td
from torch._dynamo.utils import counters

from hpctrain.train import warmup

CPU = torch.device("cpu")


@pytest.fixture
def group_of_one():
    td.init_process_group("gloo", store=td.HashStore(), rank=0, world_size=1)
    yield
    td.destroy_process_group()


def target(model: torch.nn.Module, ddp) -> warmup.WarmupTarget:
    """What warm_compile reads: a config (its batch and image size, compile.timeout_s), the model,
    its DDP wrapper and no control group."""
    cfg = SimpleNamespace(
        per_rank_batch=lambda world: 4, model=SimpleNamespace(img_size=4), compile=SimpleNamespace(timeout_s=60)
    )
    return warmup.WarmupTarget(cfg, CPU, 1, model, ddp, ddp, optimizer=None, step_amp="none")


@pytest.mark.slow  # a cold compile: ~10 s on 2 cores
def test_warm_compile_compiles_forward_and_backward_and_changes_nothing(group_of_one):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(48, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 10)
    )
    ddp = torch.nn.parallel.DistributedDataParallel(torch.compile(model))
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    first = next(model.parameters())
    first.grad = torch.full_like(first, 3.0)  # a backward would add to it
    grad = first.grad
    torch.manual_seed(123)
    random.seed(7)
    rng, py = torch.get_rng_state(), random.getstate()
    counters.clear()
    warmup.warm_compile(target(model, ddp))
    assert counters["aot_autograd"]["total"] >= 1  # the forward was compiled here
    assert torch.equal(torch.get_rng_state(), rng) and random.getstate() == py  # dropout drew, then restored
    assert first.grad is grad and torch.equal(grad, torch.full_like(first, 3.0))
    assert all(p.grad is None for p in list(model.parameters())[1:])
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    # a step after it compiles nothing more: the backward was lowered in the warm-up too
    first.grad = None
    compiled = dict(counters["inductor"])
    ddp(torch.zeros(4, 3, 4, 4)).sum().backward()
    assert dict(counters["inductor"]) == compiled

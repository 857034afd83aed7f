"""train.amp=fp16 with our Adam-family optimizers (AdamWLowMu, LAMB): GradScaler hands them found_inf on
the device (`_step_supports_amp_scaling`), and the fused kernel skips a step with an inf there, so a
step reads nothing on the host. Before, GradScaler read found_inf with `.item()` before every step
(a host sync per step on a GPU), as it does for any optimizer without that flag (torch's own AdamW
with foreach=True below: the check that the count can fail)."""

from __future__ import annotations

import pytest
import torch

from hpctrain.train import compat
from hpctrain.train.optim.adamw import AdamWLowMu
from hpctrain.train.optim.lamb import Lamb

pytestmark = pytest.mark.skipif(
    not (compat.cpu_fused_adam() and hasattr(torch.amp, "GradScaler")),
    reason="the CPU's fused Adam kernel and torch.amp.GradScaler('cpu') need torch >= 2.4",
)

OPTIMIZERS = {
    "adamw_low_mu": lambda ps: AdamWLowMu(ps, lr=1e-2, weight_decay=0.05),
    "lamb": lambda ps: Lamb(ps, lr=1e-2, weight_decay=0.05),
    "lamb_no_decay": lambda ps: Lamb(ps, lr=1e-2),
}


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def loss_of(m: torch.nn.Module, i: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(i)
    x, y = torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)
    return ((m(x) - y) ** 2).mean()


def counting(item, reads: list, step: int):
    """`Tensor.item` that notes `step` in `reads` at each call."""

    def counted(t):
        reads.append(step)
        return item(t)

    return counted


def scaled_steps(make, steps: int, inf_at: tuple[int, ...] = (), reads: list | None = None):
    """`steps` steps as train/loop.py takes them under fp16 (scale, backward, unscale_, step, update),
    an inf put in one gradient at the steps `inf_at`; `reads` collects each `.item()` of a step."""
    m = model()
    opt = make(list(m.parameters()))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    for i in range(steps):
        scaler.scale(loss_of(m, i)).backward()
        if i in inf_at:
            next(m.parameters()).grad[0, 0] = float("inf")
        scaler.unscale_(opt)
        item = torch.Tensor.item
        if reads is not None:
            torch.Tensor.item = counting(item, reads, i)  # type: ignore[method-assign]
        try:
            scaler.step(opt)
        finally:
            torch.Tensor.item = item  # type: ignore[method-assign]
        scaler.update()
        opt.zero_grad(set_to_none=True)
    return m, opt, scaler


def plain_steps(make, steps: int, skip: tuple[int, ...] = ()):
    """The same steps without a scaler, the steps in `skip` left out (what a skip must equal)."""
    m = model()
    opt = make(list(m.parameters()))
    for i in range(steps):
        loss_of(m, i).backward()
        if i not in skip:
            opt.step()
        opt.zero_grad(set_to_none=True)
    return m, opt


def assert_same_state(m, opt, ref, ref_opt, steps: int) -> None:
    """Weights, both moments and the step count equal, bit for bit, to the reference run's."""
    for a, b in zip(m.parameters(), ref.parameters()):
        assert torch.equal(a, b)
    for p, q in zip(m.parameters(), ref.parameters()):
        s, r = opt.state[p], ref_opt.state[q]
        assert torch.equal(s["exp_avg"], r["exp_avg"]) and torch.equal(s["exp_avg_sq"], r["exp_avg_sq"])
        assert float(s["step"]) == float(r["step"]) == steps


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_an_fp16_step_reads_nothing_on_the_host_and_equals_the_unscaled_step(name):
    reads: list[int] = []
    m, opt, _ = scaled_steps(OPTIMIZERS[name], 3, reads=reads)
    assert reads == []
    ref, ref_opt = plain_steps(OPTIMIZERS[name], 3)
    # a power-of-two scale unscales exactly: the same kernel on the same gradients
    assert_same_state(m, opt, ref, ref_opt, steps=3)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_an_inf_in_one_gradient_skips_the_whole_step_on_the_device(name):
    """Weights, both moments and the step count as if the step had not been taken; the scale halves
    (GradScaler's backoff); the steps after it go on as the plain run's."""
    m, opt, scaler = scaled_steps(OPTIMIZERS[name], 4, inf_at=(1,))
    ref, ref_opt = plain_steps(OPTIMIZERS[name], 4, skip=(1,))
    assert_same_state(m, opt, ref, ref_opt, steps=3)
    assert scaler.get_scale() == 2.0**9


def test_torchs_foreach_adamw_reads_found_inf_on_the_host_each_step():
    """What the flag saves: GradScaler's `.item()` before each step of an optimizer without it."""
    reads: list[int] = []
    scaled_steps(lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=True), 3, reads=reads)
    assert sorted(set(reads)) == [0, 1, 2]  # found_inf (and, on the CPU, its own step counts) each step


def test_a_bucket_the_kernel_cannot_take_reads_found_inf_once_and_still_skips():
    """bf16 parameters (no fused kernel for them here): GradScaler's own way, one `.item()` a step."""
    m = model().to(torch.bfloat16)
    opt = Lamb(list(m.parameters()), lr=1e-2)
    before = [p.detach().clone() for p in m.parameters()]
    for p in m.parameters():
        p.grad = torch.ones_like(p)
    next(m.parameters()).grad[0, 0] = float("inf")
    opt.found_inf, opt.grad_scale = torch.ones(()), None  # as GradScaler.step sets them
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), before))
    opt.found_inf = torch.zeros(())
    opt.step()
    assert not all(torch.equal(a, b) for a, b in zip(m.parameters(), before))

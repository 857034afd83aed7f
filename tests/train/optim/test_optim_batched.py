"""The optimizers' device path: every foreach op a step runs can take CUDA's batched
kernel (its tensor lists match tensor for tensor, docs/large-batch.md), so the kernels per step do not
grow with the number of parameter tensors; LAMB's new trust-ratio step equals the old one bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hpctrain.train.optim.adamw import AdamWLowMu
from hpctrain.train.optim.lamb import Lamb

ALLOC = {"empty", "empty_like", "empty_strided", "lift_fresh"}  # allocations: no kernel


class Kernels(TorchDispatchMode):
    """Kernels a step would launch on CUDA, counted by ATen's rule (ForeachUtils.h, can_use_fast_route):
    a foreach op whose tensor lists share sizes, strides and dtype tensor for tensor is one batched
    launch, any other runs one kernel per tensor; views and allocations launch none."""

    def __init__(self):
        super().__init__()
        self.count, self.per_tensor = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        lists = [a for a in args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
        if name.startswith("_foreach_") and lists:
            first = lists[0]
            # _foreach_copy_ converts dtypes in its batched kernel (skip_dtype_check in torch's CUDA copy)
            same_dtype = name == "_foreach_copy_" or all(t.dtype == first[0].dtype for lst in lists for t in lst)
            fast = same_dtype and all(
                t.shape == f.shape and t.stride() == f.stride() for lst in lists for t, f in zip(lst, first)
            )
            self.count += 1 if fast else len(first)
            if not fast:
                self.per_tensor.append(func.__name__)
        elif not (func.is_view or name in ALLOC):
            self.count += 1
        return func(*args, **(kwargs or {}))


def model(blocks: int) -> list[torch.nn.Parameter]:
    """`blocks` repeats of four shapes plus a head, as a ViT repeats its blocks."""
    gen = torch.Generator().manual_seed(blocks)
    shapes = [(8, 4), (8,), (4, 8), (4,)] * blocks + [(3, 4)]
    return [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]


def step_kernels(cls, blocks: int, **kw) -> Kernels:
    params = model(blocks)
    opt = cls(params, lr=0.01, weight_decay=0.1, **kw)
    opt.cpu_fused, opt.cpu_chunk = False, 0  # the accelerator's path: foreach ops over whole buckets
    gen = torch.Generator().manual_seed(7)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    opt.step()  # the state exists: the counted step is a steady one
    with Kernels() as k:
        opt.step()
    return k


@pytest.mark.parametrize(
    "cls, kw", [(Lamb, {}), (Lamb, {"always_adapt": True}), (AdamWLowMu, {}), (AdamWLowMu, {"mu_dtype": torch.float32})]
)
def test_device_step_kernels_do_not_grow_with_the_parameter_tensors(cls, kw):
    """Before: LAMB's w += -lr·r·ratio was one `_foreach_addcmul_` with a list of 0-d ratios, which
    CUDA runs one kernel per tensor (3 blocks: 13 kernels more than 1 block's)."""
    small, large = step_kernels(cls, 1, **kw), step_kernels(cls, 3, **kw)
    assert small.per_tensor == [] and large.per_tensor == []
    assert small.count == large.count


class LambAddcmul(Lamb):
    """Lamb.apply before the change: the reference."""

    @staticmethod
    def apply(b, group, r):
        lr = group["lr"]
        if group["weight_decay"] != 0 or group["always_adapt"]:
            w_norm = torch.stack(torch._foreach_norm(b.params))
            r_norm = torch.stack(torch._foreach_norm(r))
            ratio = torch.where((w_norm > 0) & (r_norm > 0), w_norm / r_norm, torch.ones_like(w_norm))
            torch._foreach_addcmul_(b.params, r, list(ratio.unbind()), value=-lr)
        else:
            torch._foreach_add_(b.params, r, alpha=-lr)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("always_adapt", [True, False])
def test_lamb_scaled_per_shape_equals_the_addcmul_step_bit_for_bit(fused, always_adapt):
    """The same `_foreach_addcmul_`, its ratios spread over full tensors instead of 0-d ones (the CPU
    kernel computes fma(value·r, ratio, w) either way): every parameter and moment equal after 5 steps."""
    init = model(3)
    init[5].data.zero_()  # ||w|| = 0: the ratio is 1
    new, old = (
        [torch.nn.Parameter(t.detach().clone()) for t in init],
        [torch.nn.Parameter(t.detach().clone()) for t in init],
    )
    opts = []
    for cls, ps in ((Lamb, new), (LambAddcmul, old)):
        opt = cls(
            [{"params": ps[:6], "weight_decay": 0.1}, {"params": ps[6:], "weight_decay": 0.0}],
            lr=0.05,
            always_adapt=always_adapt,
        )
        opt.cpu_fused = fused
        opts.append(opt)
    for s in range(5):
        gen = torch.Generator().manual_seed(100 + s)
        grads = [torch.randn(p.shape, generator=gen) for p in new]
        for p, q, g in zip(new, old, grads):
            p.grad, q.grad = g.clone(), g.clone()
        for opt in opts:
            opt.step()
    for p, q in zip(new, old):
        assert torch.equal(p, q)
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(opts[0].state[p][k], opts[1].state[q][k])
    assert not torch.equal(new[0], init[0])

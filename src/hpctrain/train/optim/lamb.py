"""LAMB: Adam's step rescaled per tensor by a trust ratio ||w|| / ||update|| (You et al., "Large Batch
Optimization for Deep Learning: Training BERT in 76 minutes", ICLR 2020, Algorithm 2).

Ours because the maintained PyTorch LAMBs come with more than we want: timm's needs torchvision,
apex's needs a CUDA build, torch has none. Per tensor w of a parameter group with weight decay λ:

    m = β1·m + (1-β1)·g            v = β2·v + (1-β2)·g²
    r = (m / (1-β1^t)) / (sqrt(v / (1-β2^t)) + ε) + λ·w
    w = w - lr · φ(||w||) / ||r|| · r,     φ = identity; ratio 1 when ||w|| or ||r|| is 0

Tensors in a group without weight decay (norms, biases, position embedding, class token: see
`optim.param_groups`): the paper adapts every layer (`always_adapt=True`, config
`optim.lamb_adapt: all`, the default here); NVIDIA's apex FusedLAMB and timm's Lamb skip the ratio
there by default and take the plain Adam step (`optim.lamb_adapt: decayed`). On the digits ViT the
paper's rule trained faster (docs/large-batch.md). The ratio is taken on the full tensor, so the
parameters must not be sharded (no FSDP). Each line is one `torch._foreach_*` call over all tensors
of a dtype and device (train/optim/moments.py), the norms one `torch._foreach_norm` per list; on the CPU
the first three lines of fp32 tensors are one pass of torch's fused Adam kernel (see `update`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from hpctrain.train.optim.moments import AdamFamily, Bucket, bias_corrections, fused_adam_


class Lamb(AdamFamily):
    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        always_adapt: bool = False,
    ):
        super().__init__(params, lr, betas, eps, weight_decay, always_adapt=always_adapt)

    def update(self, b: Bucket, group: dict) -> None:
        beta1, beta2 = group["betas"]
        eps, wd = group["eps"], group["weight_decay"]
        m, v, g = b.exp_avgs, b.exp_avg_sqs, b.grads
        if self.fused(b):
            # Adam's step from zero with lr = -1 is r = m̂ / (sqrt(v̂) + ε), moments updated, in one pass
            r = self.scratch.views(b.params, zero=True)
            fused_adam_(r, g, m, v, b.step_tensors, group, lr=-1.0)
            if wd:
                torch._foreach_add_(r, b.params, alpha=wd)
            self.apply(b, group, r)
            return
        torch._foreach_lerp_(m, g, 1 - beta1)
        torch._foreach_mul_(v, beta2)
        torch._foreach_addcmul_(v, g, g, value=1 - beta2)
        # m̂ / (sqrt(v̂) + ε) = m·sqrt(c2)/c1 / (sqrt(v) + ε·sqrt(c2)), c = 1 - β^t: two passes fewer
        c1, c2 = bias_corrections(beta1, b.steps), bias_corrections(beta2, b.steps)
        denom = torch._foreach_sqrt(v)
        torch._foreach_add_(denom, [eps * math.sqrt(c) for c in c2])
        scale = [math.sqrt(a) / c for a, c in zip(c2, c1)]
        if wd:  # r = λ·w + m̂ / (sqrt(v̂) + ε)
            r = torch._foreach_mul(b.params, wd)
            torch._foreach_addcdiv_(r, m, denom, scale)
        else:
            r = torch._foreach_div(m, denom)
            torch._foreach_mul_(r, scale)
        self.apply(b, group, r)

    def update_scaled(self, b: Bucket, group: dict, grad_scale: torch.Tensor | None, found_inf: torch.Tensor) -> None:
        """fp16: Adam's step from zero with lr = -1 through the fused kernel, which leaves it zero (and the
        moments as they were) where it skips; the weight decay term is weighted by 1 - found_inf, so a
        skipped step moves no weight (a zero update: trust ratio 1, `apply`)."""
        r = self.scratch.views(b.params, zero=True)
        fused_adam_(
            r,
            b.grads,
            b.exp_avgs,
            b.exp_avg_sqs,
            b.step_tensors,
            group,
            lr=-1.0,
            grad_scale=grad_scale,
            found_inf=found_inf,
        )
        wd = group["weight_decay"]
        if wd:
            keep = (1 - found_inf).to(r[0].device, non_blocking=True) * wd
            torch._foreach_add_(r, torch._foreach_mul(b.params, keep))
        self.apply(b, group, r)

    @staticmethod
    def apply(b: Bucket, group: dict, r: list[torch.Tensor]) -> None:
        """w -= lr · ratio · r, the trust ratio where the group adapts. The ratios stay on the device (no
        sync). A foreach op takes CUDA's batched kernel only when its lists match tensor for tensor in
        shape (docs/large-batch.md): 0-d ratios against the tensors ran one kernel per tensor, so each
        shape's ratios are spread over a tensor of that shape (one kernel per distinct shape)."""
        lr = group["lr"]
        if not (group["weight_decay"] != 0 or group["always_adapt"]):
            torch._foreach_add_(b.params, r, alpha=-lr)
            return
        shapes: dict[torch.Size, list[int]] = {}
        for i, t in enumerate(r):
            shapes.setdefault(t.shape, []).append(i)
        order = [i for idx in shapes.values() for i in idx]
        params, r = [b.params[i] for i in order], [r[i] for i in order]
        w_norm = torch.stack(torch._foreach_norm(params))
        r_norm = torch.stack(torch._foreach_norm(r))
        ratio = torch.where((w_norm > 0) & (r_norm > 0), w_norm / r_norm, torch.ones_like(w_norm))
        spread, at = [], 0
        for shape, idx in shapes.items():
            k = len(idx)
            spread.extend(ratio[at : at + k].view(k, *[1] * len(shape)).expand(k, *shape).contiguous().unbind(0))
            at += k
        torch._foreach_addcmul_(params, r, spread, value=-lr)  # the same rounding as with the 0-d ratios

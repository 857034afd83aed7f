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
parameters must not be sharded (no FSDP).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from hpctrain.train.moments import AdamFamily


class Lamb(AdamFamily):
    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, always_adapt: bool = False):
        super().__init__(params, lr, betas, eps, weight_decay, always_adapt=always_adapt)

    def update(self, p: torch.Tensor, state: dict, group: dict, t: float) -> None:
        beta1, beta2 = group["betas"]
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (v / (1 - beta2 ** t)).sqrt_().add_(eps)
        r = (m / (1 - beta1 ** t)).div_(denom)
        if wd:
            r.add_(p, alpha=wd)
        if wd != 0 or group["always_adapt"]:
            w_norm, r_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(r)
            one = torch.ones_like(w_norm)
            r.mul_(torch.where((w_norm > 0) & (r_norm > 0), w_norm / r_norm, one))
        p.add_(r, alpha=-lr)

"""AdamW whose first moment is stored in bfloat16, as big_vision's `optax.scale_by_adam(mu_dtype=
'bfloat16')` (configs/vit_s16_i1k.py): half the memory of the momentum, same update otherwise.

torch's AdamW has no such option (its states follow the parameter's dtype), hence this small one,
used only for `optim.mu_dtype=bf16`. Per tensor, as optax's `scale_by_adam` does it (optax/_src/
transform.py): the new moment is computed in fp32 from the stored bf16 one, the step uses that fp32
value, and only the stored copy is rounded to bf16:

    m = β1·bf16(m_prev) + (1-β1)·g   (fp32)     v = β2·v + (1-β2)·g²   (fp32)
    w = w·(1 - lr·λ) - lr · (m / (1-β1^t)) / (sqrt(v / (1-β2^t)) + ε)
    m_stored = bf16(m)

Weight decay is decoupled as in torch's AdamW (lr·λ); big_vision's wd·schedule equals it with
λ = wd / base lr (docs/recipes.md).

On the CPU (fp32 parameters) the three lines are torch's fused AdamW kernel, one pass over each
tensor, between a copy of the stored moment into a reused fp32 buffer and its rounding back; elsewhere
each line is one `torch._foreach_*` call over all tensors of a dtype and device (train/optim/moments.py).
bench/optim_step.py has the cost of each.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from hpctrain.train.optim.moments import AdamFamily, Bucket, as_fp32, bias_corrections, copy_, fused_adam_


class AdamWLowMu(AdamFamily):
    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        mu_dtype: torch.dtype = torch.bfloat16,
    ):
        self.mu_dtype = mu_dtype
        super().__init__(params, lr, betas, eps, weight_decay)

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's loader casts every floating state to its parameter's dtype: put the moment back in
        mu_dtype (bf16 → fp32 → bf16 is exact, so a resume continues bit for bit)."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            if "exp_avg" in state:
                state["exp_avg"] = state["exp_avg"].to(self.mu_dtype)

    def fused_step(
        self, b: Bucket, group: dict, grad_scale: torch.Tensor | None = None, found_inf: torch.Tensor | None = None
    ) -> None:
        """The fused kernel, one pass per tensor; a bf16 moment goes through a reused fp32 copy and is
        rounded back to nearest even, as jnp.astype (exactly, where an fp16 step skips: bf16 → fp32 → bf16)."""
        m = b.exp_avgs if b.exp_avgs[0].dtype == torch.float32 else self.scratch.views(b.exp_avgs)
        if m is not b.exp_avgs:
            copy_(m, b.exp_avgs)
        fused_adam_(
            b.params,
            b.grads,
            m,
            b.exp_avg_sqs,
            b.step_tensors,
            group,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            grad_scale=grad_scale,
            found_inf=found_inf,
        )
        if m is not b.exp_avgs:
            copy_(b.exp_avgs, m)

    def update_scaled(self, b: Bucket, group: dict, grad_scale: torch.Tensor | None, found_inf: torch.Tensor) -> None:
        """fp16: the fused kernel, GradScaler's tensors on the device (`fused_step`)."""
        self.fused_step(b, group, grad_scale, found_inf)

    def update(self, b: Bucket, group: dict) -> None:
        if self.fused(b):
            self.fused_step(b, group)
            return
        beta1, beta2 = group["betas"]
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        g = as_fp32(b.grads)
        m = as_fp32(b.exp_avgs)  # fp32 moments (mu_dtype=fp32) are updated in place
        torch._foreach_lerp_(m, g, 1 - beta1)  # β1·m + (1-β1)·g
        v = b.exp_avg_sqs
        torch._foreach_mul_(v, beta2)
        torch._foreach_addcmul_(v, g, g, value=1 - beta2)
        # m̂ / (sqrt(v̂) + ε) = m·sqrt(c2)/c1 / (sqrt(v) + ε·sqrt(c2)), c = 1 - β^t: two passes fewer
        c1, c2 = bias_corrections(beta1, b.steps), bias_corrections(beta2, b.steps)
        denom = torch._foreach_sqrt(v)
        torch._foreach_add_(denom, [eps * math.sqrt(c) for c in c2])
        if wd:
            torch._foreach_mul_(b.params, 1 - lr * wd)
        torch._foreach_addcdiv_(b.params, m, denom, [-lr * math.sqrt(a) / c for a, c in zip(c2, c1)])
        if m is not b.exp_avgs:
            copy_(b.exp_avgs, m)  # round to nearest even, as jnp.astype

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
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from hpctrain.train.moments import AdamFamily


class AdamWLowMu(AdamFamily):
    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, mu_dtype: torch.dtype = torch.bfloat16):
        self.mu_dtype = mu_dtype
        super().__init__(params, lr, betas, eps, weight_decay)

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's loader casts every floating state to its parameter's dtype: put the moment back in
        mu_dtype (bf16 → fp32 → bf16 is exact, so a resume continues bit for bit)."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            if "exp_avg" in state:
                state["exp_avg"] = state["exp_avg"].to(self.mu_dtype)

    def update(self, p: torch.Tensor, state: dict, group: dict, t: float) -> None:
        beta1, beta2 = group["betas"]
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        g = p.grad.float()
        m = state["exp_avg"].float().mul_(beta1).add_(g, alpha=1 - beta1)
        v = state["exp_avg_sq"]
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (v / (1 - beta2 ** t)).sqrt_().add_(eps)
        if wd:
            p.mul_(1 - lr * wd)
        p.add_((m / (1 - beta1 ** t)).div_(denom).to(p.dtype), alpha=-lr)
        state["exp_avg"].copy_(m)  # round to nearest even, as jnp.astype

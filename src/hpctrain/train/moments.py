"""The loop our two Adam-family optimizers share (AdamWLowMu, Lamb): closure, sparse refusal, lazy
first- and second-moment state, step count. Each subclass supplies only its per-tensor update."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


class AdamFamily(torch.optim.Optimizer):
    mu_dtype: torch.dtype | None = None  # the first moment's dtype (None: the parameter's)

    def __init__(self, params: Iterable, lr: float, betas: tuple[float, float], eps: float,
                 weight_decay: float, **extra):
        if lr <= 0 or eps <= 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"{type(self).__name__}: lr {lr}, eps {eps} must be > 0, weight_decay "
                             f"{weight_decay} >= 0, betas {betas} in [0, 1)")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                                  **extra})

    def update(self, p: torch.Tensor, state: dict, group: dict, t: float) -> None:
        """Apply step t to one parameter; state holds exp_avg and exp_avg_sq."""
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure: Callable | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not take sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)  # on the CPU: no device sync
                    state["exp_avg"] = torch.zeros_like(p, dtype=self.mu_dtype, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                self.update(p, state, group, float(state["step"]))
        return loss

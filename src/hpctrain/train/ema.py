"""Exponential moving average of the weights (fp32 copy, updated after each optimizer step)."""

from __future__ import annotations

import copy

import torch


class EMA:
    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay = decay
        self.module = copy.deepcopy(model).eval().float()
        for p in self.module.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        ema = list(self.module.state_dict().values())
        src = list(model.state_dict().values())
        floats = [(e, s) for e, s in zip(ema, src) if e.is_floating_point()]
        torch._foreach_lerp_([e for e, _ in floats], [s.float() for _, s in floats], 1.0 - self.decay)

    def state_dict(self) -> dict:
        return self.module.state_dict()

    def load_state_dict(self, sd: dict) -> None:
        self.module.load_state_dict(sd)

"""Exponential moving average of the weights (fp32 copy, updated after each optimizer step).

The step's update is one `torch._foreach_lerp_` over lists of the live tensors of both models, built
once (`state_dict(keep_vars=True)`, the same tensors and order `state_dict()` gives) instead of two
`state_dict()` calls per step (bench/host_costs.py). A `load_state_dict` on either model may put new
tensors in place of the old ones (`assign=True`, DCP's loaders), so a post-load hook on both drops
the lists and the next update builds them again; so does an update with another model object.
"""

from __future__ import annotations

import copy
import weakref

import torch


class EMA:
    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay = decay
        self.module = copy.deepcopy(model).eval().float()
        for p in self.module.parameters():
            p.requires_grad_(False)
        self._lists: tuple[list[torch.Tensor], list[torch.Tensor], bool] | None = None
        self._src: weakref.ref | None = None  # the model the lists were built from
        self._watch(self.module)

    def _watch(self, module: torch.nn.Module) -> None:
        """Drop the cached lists whenever `module` loads a state dict (weakly: the hook keeps no EMA alive)."""
        me = weakref.ref(self)

        def drop(_module, _keys):
            ema = me()
            if ema is not None:
                ema._lists = None

        module.register_load_state_dict_post_hook(drop)

    def _tensors(self, model: torch.nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor], bool]:
        if self._lists is None or self._src is None or self._src() is not model:
            if self._src is None or self._src() is not model:
                self._watch(model)
                self._src = weakref.ref(model)
            ema = self.module.state_dict(keep_vars=True).values()
            src = model.state_dict(keep_vars=True).values()
            floats = [(e, s) for e, s in zip(ema, src) if e.is_floating_point()]
            self._lists = (
                [e for e, _ in floats],
                [s for _, s in floats],
                all(s.dtype == torch.float32 for _, s in floats),
            )
        return self._lists

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        ema, src, fp32 = self._tensors(model)
        torch._foreach_lerp_(ema, src if fp32 else [s.float() for s in src], 1.0 - self.decay)

    def state_dict(self) -> dict:
        return self.module.state_dict()

    def load_state_dict(self, sd: dict) -> None:
        self.module.load_state_dict(sd)

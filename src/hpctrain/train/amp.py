"""Mixed precision: the autocast context of a training step or an eval forward (config `train.amp`)."""

from __future__ import annotations

import contextlib

import torch


def autocast_ctx(amp: str, device: torch.device):
    if amp == "none":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)

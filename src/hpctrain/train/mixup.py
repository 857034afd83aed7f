"""Mixup / CutMix and label smoothing as soft targets, on the training device.

Each step's randomness comes from a generator seeded by (seed, step), so a resumed run mixes
exactly as the uninterrupted one did.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def soft_targets(labels: torch.Tensor, num_classes: int, smoothing: float) -> torch.Tensor:
    off = smoothing / num_classes
    t = torch.full((labels.shape[0], num_classes), off, device=labels.device)
    return t.scatter_(1, labels[:, None], 1.0 - smoothing + off)


class Mixer:
    def __init__(
        self,
        num_classes: int,
        smoothing: float,
        mixup: float,
        cutmix: float,
        prob: float,
        switch_prob: float,
        seed: int,
    ):
        self.num_classes, self.smoothing = num_classes, smoothing
        self.mixup, self.cutmix, self.prob, self.switch_prob, self.seed = mixup, cutmix, prob, switch_prob, seed

    @property
    def active(self) -> bool:
        return self.mixup > 0 or self.cutmix > 0

    def __call__(
        self, images: torch.Tensor, labels: torch.Tensor, step: int, micro: int = 0, rank: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        targets = soft_targets(labels, self.num_classes, self.smoothing)
        if not self.active:
            return images, targets
        rng = np.random.default_rng([self.seed, step, micro, rank, 0x313])
        if rng.random() >= self.prob:
            return images, targets
        use_cutmix = self.cutmix > 0 and (self.mixup == 0 or rng.random() < self.switch_prob)
        lam = float(rng.beta(self.cutmix, self.cutmix) if use_cutmix else rng.beta(self.mixup, self.mixup))
        flipped = images.flip(0)
        if use_cutmix:
            h, w = images.shape[-2:]
            cut = math.sqrt(1.0 - lam)
            ch, cw = int(h * cut), int(w * cut)
            cy, cx = int(rng.integers(h)), int(rng.integers(w))
            y0, y1 = max(cy - ch // 2, 0), min(cy + ch // 2, h)
            x0, x1 = max(cx - cw // 2, 0), min(cx + cw // 2, w)
            images = images.clone()
            images[..., y0:y1, x0:x1] = flipped[..., y0:y1, x0:x1]
            lam = 1.0 - (y1 - y0) * (x1 - x0) / (h * w)
        else:
            images = images * lam + flipped * (1.0 - lam)
        return images, targets * lam + targets.flip(0) * (1.0 - lam)


def soft_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.sum(-targets * torch.log_softmax(logits.float(), dim=-1), dim=-1).mean()

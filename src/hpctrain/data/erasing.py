"""Random erasing after normalisation, as timm's RandomErasing (timm/data/random_erasing.py, the
`re_prob/re_mode/re_count` of create_transform that DeiT's main.py passes as reprob/remode/recount).

The boxes are drawn per sample from the sample's own generator (data/sampling.sample_seed), so they
do not depend on workers, ranks or resumes; the loaders fill them after normalisation. Per sample:
with probability `prob`, `count` boxes (1..max_count, timm's randint) each of area
U(0.02, 1/3)·H·W/count and aspect exp(U(log 0.3, log 1/0.3)) (height/width), h = round(√(area·aspect)),
w = round(√(area/aspect)), kept when h < H and w < W (strict, as timm), top-left uniform; up to 10
tries per box, none kept after 10 means no box.
"""

from __future__ import annotations

import math

import numpy as np
import torch

MIN_AREA, MAX_AREA, MIN_ASPECT, ATTEMPTS = 0.02, 1 / 3, 0.3, 10


def erase_boxes(height: int, width: int, rng: np.random.Generator, prob: float, max_count: int) -> np.ndarray:
    """(max_count, 4) int64 rows of (top, left, h, w); unused rows are zeros (h = 0: no box)."""
    out = np.zeros((max_count, 4), dtype=np.int64)
    if rng.random() >= prob:
        return out
    count = 1 if max_count == 1 else int(rng.integers(1, max_count + 1))
    area = height * width
    log_r = (math.log(MIN_ASPECT), math.log(1 / MIN_ASPECT))
    for k in range(count):
        for _ in range(ATTEMPTS):
            target = rng.uniform(MIN_AREA, MAX_AREA) * area / count
            aspect = math.exp(rng.uniform(*log_r))
            h, w = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
            if w < width and h < height:
                out[k] = (int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w)
                break
    return out


def apply_erasing(x: torch.Tensor, boxes: torch.Tensor, seeds: torch.Tensor, mode: str) -> torch.Tensor:
    """Fill `boxes` (B, K, 4) of the normalised batch `x` (B, C, H, W) in place: `pixel` = N(0,1) per
    value, `rand` = one N(0,1) per channel, `const` = 0. The noise of sample i comes from a generator
    seeded with seeds[i] on x's device, so it too is fixed by the sample."""
    boxes_l, seeds_l = boxes.tolist(), seeds.tolist()
    gen = None
    for i, rows in enumerate(boxes_l):
        for k, (top, left, h, w) in enumerate(rows):
            if h == 0:
                continue
            shape = (x.shape[1], h, w) if mode == "pixel" else (x.shape[1], 1, 1)
            if mode == "const":
                fill = torch.zeros(shape, dtype=x.dtype, device=x.device)
            else:
                if gen is None:
                    gen = torch.Generator(device=x.device)
                gen.manual_seed(int(seeds_l[i]) + k)
                fill = torch.randn(shape, generator=gen, dtype=torch.float32, device=x.device).to(x.dtype)
            x[i, :, top:top + h, left:left + w] = fill
    return x

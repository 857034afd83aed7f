"""Random erasing after normalisation, as timm's RandomErasing (timm/data/random_erasing.py, the
`re_prob/re_mode/re_count` of create_transform that DeiT's main.py passes as reprob/remode/recount).

The boxes are drawn per sample from the sample's own generator (data/sampling.sample_seed), so they
do not depend on workers, ranks or resumes; the loaders fill them after normalisation. Per sample:
with probability `prob`, `count` boxes (1..max_count, timm's randint) each of area
U(0.02, 1/3)·H·W/count and aspect exp(U(log 0.3, log 1/0.3)) (height/width), h = round(√(area·aspect)),
w = round(√(area/aspect)), kept when h < H and w < W (strict, as timm), top-left uniform; up to 10
tries per box, none kept after 10 means no box.

`erase_boxes` draws one sample's boxes from a numpy generator (the PIL loader's workers, where the
sample's generator exists anyway); `erase_boxes_batch` draws the same distribution for a whole batch
at once, for the DALI loader's main thread: each sample's uniforms come from a counter-based hash of
its key (splitmix64), so a box still depends on the sample alone, not on the batch it lands in, and
no generator is seeded per sample (a `default_rng(key)` costs ~0.1-0.4 ms: tens of ms per batch).
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


GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (Steele et al., "Fast splittable pseudorandom number generators", 2014),
    element-wise on uint64 (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def key_uniforms(keys: np.ndarray, count: int) -> np.ndarray:
    """(n, count) uniforms in [0, 1), row i a function of keys[i] (n × k non-negative integers) alone."""
    keys = np.asarray(keys, dtype=np.uint64)
    x = np.zeros(len(keys), dtype=np.uint64)
    for col in keys.T:
        x = _splitmix64(x + GOLDEN + col)
    u = _splitmix64(x[:, None] + GOLDEN * np.arange(1, count + 1, dtype=np.uint64))
    return (u >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def erase_boxes_batch(height: int, width: int, keys: np.ndarray, prob: float, max_count: int) -> np.ndarray:
    """(n, max_count, 4) int64 boxes as `erase_boxes` draws them, sample i's from keys[i] alone."""
    n = len(keys)
    u = key_uniforms(keys, 2 + 4 * ATTEMPTS * max_count)
    erased = u[:, 0] < prob
    count = np.ones(n, dtype=np.int64) if max_count == 1 else 1 + np.minimum((u[:, 1] * max_count).astype(np.int64),
                                                                          max_count - 1)
    draws = u[:, 2:].reshape(n, max_count, ATTEMPTS, 4)
    target = (MIN_AREA + (MAX_AREA - MIN_AREA) * draws[..., 0]) * (height * width) / count[:, None, None]
    lo = math.log(MIN_ASPECT)
    aspect = np.exp(lo + (-2 * lo) * draws[..., 1])
    h = np.rint(np.sqrt(target * aspect)).astype(np.int64)
    w = np.rint(np.sqrt(target / aspect)).astype(np.int64)
    ok = (w < width) & (h < height)
    first = ok.argmax(axis=2)  # the first kept try of each box
    pick = np.take_along_axis
    h, w = pick(h, first[..., None], 2)[..., 0], pick(w, first[..., None], 2)[..., 0]
    top = (pick(draws[..., 2], first[..., None], 2)[..., 0] * (height - h + 1)).astype(np.int64)
    left = (pick(draws[..., 3], first[..., None], 2)[..., 0] * (width - w + 1)).astype(np.int64)
    used = ok.any(axis=2) & erased[:, None] & (np.arange(max_count)[None, :] < count[:, None])
    return np.where(used[..., None], np.stack([top, left, h, w], axis=-1), 0)


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

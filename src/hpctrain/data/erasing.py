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

The torch loader fills the boxes per batch, not per box: `erase_fill` composes a sample's mask and
values on the CPU in its worker, `pack` puts a batch's into one buffer, and `fill_packed` makes one
copy to the device and one masked_scatter_ (docs/data.md).
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
    return (u >> np.uint64(11)).astype(np.float64) * 2.0**-53


def erase_boxes_batch(height: int, width: int, keys: np.ndarray, prob: float, max_count: int) -> np.ndarray:
    """(n, max_count, 4) int64 boxes as `erase_boxes` draws them, sample i's from keys[i] alone."""
    n = len(keys)
    u = key_uniforms(keys, 2 + 4 * ATTEMPTS * max_count)
    erased = u[:, 0] < prob
    count = (
        np.ones(n, dtype=np.int64)
        if max_count == 1
        else 1 + np.minimum((u[:, 1] * max_count).astype(np.int64), max_count - 1)
    )
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


def erase_fill(
    boxes: torch.Tensor, seed: int, mode: str, channels: int, height: int, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sample's erasing on the CPU, for a batch to apply in one go (`pack`, `fill_packed`): the
    (H, W) bool mask of erased pixels and the (channels × n,) float32 values they take, channel by
    channel in row-major order (masked_scatter_'s), a later box over an earlier one. `pixel` = N(0,1)
    per value, `rand` = one N(0,1) per channel, `const` = 0; box k's noise from a generator seeded
    `seed + k`, so it is fixed by the sample."""
    mask = torch.zeros(height, width, dtype=torch.bool)
    canvas, gen = None, None
    for k, (top, left, h, w) in enumerate(boxes.tolist()):
        if h == 0:
            continue
        if canvas is None:
            canvas = torch.zeros(channels, height, width)
        if mode != "const":
            gen = gen or torch.Generator()
            gen.manual_seed(int(seed) + k)
            shape = (channels, h, w) if mode == "pixel" else (channels, 1, 1)
            canvas[:, top : top + h, left : left + w] = torch.randn(shape, generator=gen, dtype=torch.float32)
        else:
            canvas[:, top : top + h, left : left + w] = 0.0
        mask[top : top + h, left : left + w] = True
    return mask, (canvas[:, mask].reshape(-1) if canvas is not None else torch.zeros(0))


def pack(masks: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """A batch's erasing as one uint8 buffer (one host-to-device copy): the float32 values, then the
    (B, H, W) masks; `fill_packed` splits it again."""
    return torch.cat([values.view(torch.uint8), masks.view(torch.uint8).reshape(-1)])


def fill_packed(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """Erase the normalised batch `x` (B, C, H, W) in place from `pack`'s buffer: one copy to x's
    device and one masked_scatter_, however many boxes and samples."""
    b, c, h, w = x.shape
    n = packed.numel() - b * h * w  # bytes of values
    packed = packed.to(x.device, non_blocking=True)
    mask = packed[n:].view(torch.bool).view(b, 1, h, w).expand(b, c, h, w)
    return x.masked_scatter_(mask, packed[:n].view(torch.float32).to(x.dtype))


def apply_erasing(x: torch.Tensor, boxes: torch.Tensor, seeds: torch.Tensor, mode: str) -> torch.Tensor:
    """Fill `boxes` (B, K, 4) of the normalised batch `x` (B, C, H, W) in place (erase_fill's values,
    sample i's noise seeded by seeds[i]); the torch loader does erase_fill in its workers instead."""
    _, c, h, w = x.shape
    fills = [erase_fill(bx, s, mode, c, h, w) for bx, s in zip(boxes, seeds.tolist())]
    return fill_packed(x, pack(torch.stack([m for m, _ in fills]), torch.cat([v for _, v in fills])))

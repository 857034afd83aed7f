"""TensorFlow's inception crop (`data.crop=tf_inception`), as big_vision and vit_jax draw it.

Both call `tf.image.sample_distorted_bounding_box(..., min_object_covered=0,
use_image_if_no_bounding_boxes=True)`. Its kernel (sample_distorted_bounding_box_op.cc,
`GenerateRandomCrop` and the attempt loop in `DoCompute`; facts and lines in docs/recipes.md) differs
from timm's RandomResizedCrop: the aspect ratio is drawn uniformly (timm: log-uniform), then the
*height* uniformly among the integers whose area lies in range, the largest height clipped to what
fits the image instead of rejecting the draw (timm draws the area uniformly and rejects what does not
fit). Heights uniform mean areas ∝ h², so TF's crops are smaller on average (500×375 at 5-100 %: mean
area 0.34 vs timm's 0.42). After `max_attempts` failures the crop is the whole image.

Two implementations of the same rule: `tf_inception_box` (numpy, the PIL loader's workers) and
`dali_tf_inception_box` (DALI operators, inside the pipeline); both vectorise the attempts and keep
the first that succeeds, which is what the kernel's loop returns.
"""

from __future__ import annotations

import numpy as np

ASPECT_RANGE = (0.75, 1.33)  # TF's op default (core/ops/image_ops.cc) and big_vision's ratio_min/max
MAX_ATTEMPTS = 100  # TF's op default; neither big_vision nor vit_jax sets it
_EPS = 1e-7  # the kernel's kEps in the width clip


def tf_inception_box(
    w: int,
    h: int,
    rng: np.random.Generator,
    area_range: tuple[float, float],
    aspect_range: tuple[float, float] = ASPECT_RANGE,
    max_attempts: int = MAX_ATTEMPTS,
) -> tuple[int, int, int, int]:
    """(x0, y0, x1, y1) of one crop of a w×h image, drawn as TF's SampleDistortedBoundingBox."""
    f32 = np.float32
    ar = rng.random(max_attempts, dtype=np.float32) * f32(aspect_range[1] - aspect_range[0]) + f32(aspect_range[0])
    u_h = rng.random(max_attempts)
    u_x, u_y = rng.random(2)
    min_area = f32(area_range[0]) * f32(w) * f32(h)
    max_area = f32(area_range[1]) * f32(w) * f32(h)
    height = np.rint(np.sqrt(min_area / ar))
    max_h = np.rint(np.sqrt(max_area / ar))
    # widest height whose rounded width fits: floor((w + 0.5 - eps) / ar), one less if rounding still overflows
    clip = np.floor((w + 0.5 - _EPS) / ar)
    clip = clip - (np.rint(clip * ar) > w)
    max_h = np.minimum(np.where(np.rint(max_h * ar) > w, clip, max_h), h)
    height = np.minimum(height, max_h)
    height = height + np.floor(u_h * (max_h - height + 1))  # uniform integer in [height, max_h]
    width = np.rint(height * ar)
    area = width * height
    small = area < min_area  # the kernel's two rounding repairs: one taller, then one shorter
    height = np.where(small, height + 1, height)
    width = np.where(small, np.rint(height * ar), width)
    area = width * height
    large = area > max_area
    height = np.where(large, height - 1, height)
    width = np.where(large, np.rint(height * ar), width)
    area = width * height
    ok = (area >= min_area) & (area <= max_area) & (width <= w) & (height <= h) & (width > 0) & (height > 0)
    if not ok.any():
        return 0, 0, w, h
    i = int(np.argmax(ok))
    cw, ch = int(width[i]), int(height[i])
    x = int(u_x * (w - cw))  # SimplePhilox::Uniform(n) is in [0, n): the last offset is never drawn
    y = int(u_y * (h - ch))
    return x, y, x + cw, y + ch


def dali_tf_inception_box(
    shape,
    area_range: tuple[float, float],
    aspect_range: tuple[float, float] = ASPECT_RANGE,
    max_attempts: int = MAX_ATTEMPTS,
):
    """(anchor, size) DataNodes, int32 [x, y] and [w, h], of TF's crop for images of HWC `shape`
    (e.g. fn.peek_image_shape). The same arithmetic as `tf_inception_box`, on DALI's CPU operators:
    `max_attempts` draws per sample, the first success chosen by a min-reduction over attempt indices."""
    from nvidia.dali import fn, types  # heavy optional package: only DALI pipelines call this
    from nvidia.dali import math as dmath

    def rint(x):
        return dmath.floor(x + 0.5)

    def where(cond, a, b):
        c = fn.cast(cond, dtype=types.FLOAT)
        return c * a + (1.0 - c) * b

    hw = fn.cast(shape, dtype=types.FLOAT)
    h, w = hw[0], hw[1]
    k = max_attempts
    ar = fn.random.uniform(range=list(aspect_range), shape=[k])
    u_h = fn.random.uniform(range=[0.0, 1.0], shape=[k])
    u_x = fn.random.uniform(range=[0.0, 1.0])
    u_y = fn.random.uniform(range=[0.0, 1.0])
    min_area = float(area_range[0]) * w * h
    max_area = float(area_range[1]) * w * h
    height = rint(dmath.sqrt(min_area / ar))
    max_h = rint(dmath.sqrt(max_area / ar))
    clip = dmath.floor((w + (0.5 - _EPS)) / ar)
    clip = where(rint(clip * ar) > w, clip - 1.0, clip)
    max_h = dmath.min(where(rint(max_h * ar) > w, clip, max_h), h)
    height = dmath.min(height, max_h)
    height = height + dmath.floor(u_h * (max_h - height + 1.0))
    width = rint(height * ar)
    small = width * height < min_area
    height = where(small, height + 1.0, height)
    width = where(small, rint(height * ar), width)
    large = width * height > max_area
    height = where(large, height - 1.0, height)
    width = where(large, rint(height * ar), width)
    area = width * height
    ok = fn.cast(
        (area >= min_area) & (area <= max_area) & (width <= w) & (height <= h) & (width > 0.0) & (height > 0.0),
        dtype=types.FLOAT,
    )
    index = fn.constant(fdata=[float(i) for i in range(k)], shape=[k])
    first = fn.reductions.min(ok * index + (1.0 - ok) * float(k))
    pick = fn.cast(index == first, dtype=types.FLOAT)
    found = fn.cast(first < float(k), dtype=types.FLOAT)
    cw = found * fn.reductions.sum(pick * width) + (1.0 - found) * w
    ch = found * fn.reductions.sum(pick * height) + (1.0 - found) * h
    x = dmath.floor(u_x * (w - cw))
    y = dmath.floor(u_y * (h - ch))
    return (fn.cast(fn.stack(x, y), dtype=types.INT32), fn.cast(fn.stack(cw, ch), dtype=types.INT32))

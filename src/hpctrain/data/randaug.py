"""RandAugment as timm (DeiT's `rand-m9-mstd0.5-inc1`) defines it, run by DALI.

DALI's own `rand_augment` reads `m` as a bin out of 31 (so m=9 rotates by 9°) and has no
magnitude noise, no per-op probability and a different op set. Here the magnitude is timm's
0-10 scale: every op maps a magnitude to its parameter with timm's level function
(timm/data/auto_augment.py), the suite is timm's (`_RAND_INCREASING_TRANSFORMS` with inc1,
`_RAND_TRANSFORMS` without), each chosen op applies with probability 0.5 (timm `rand_augment_ops`),
and the magnitude noise `mstd` is a per-op, per-sample Gaussian clipped to [0, 10].

DALI looks parameters up by integer bin, so magnitudes are quantised to 1/QUANT (0.01): each op's
table holds its timm parameter at every 0.01 of magnitude. Without noise, M hits a bin exactly.

The parsing half is `hpctrain.randaug_spec` (no numpy: config validation runs on login nodes).
"""

from __future__ import annotations

import numpy as np

from hpctrain.data import dali_compat
from hpctrain.randaug_spec import LEVEL_DENOM, RandAugSpec, parse_randaugment  # noqa: F401 (re-exported)

QUANT = 100  # magnitude bins per unit of M
BINS = int(LEVEL_DENOM) * QUANT + 1
TRANSLATE_PCT = 0.45  # timm hparams translate_pct default (TranslateXRel / TranslateYRel)


# --------------------------------------------------------------------- timm's level functions
# Each maps a signed magnitude v in [-10, 10] (the sign is timm's `_randomly_negate`, drawn by DALI
# for the ops that have one) to the op's parameter, as timm's *_level_to_arg does.


def rotate_deg(v: float) -> float:
    return v / LEVEL_DENOM * 30.0


def shear(v: float) -> float:
    return v / LEVEL_DENOM * 0.3


def translate_frac(v: float) -> float:
    return v / LEVEL_DENOM * TRANSLATE_PCT


def enhance_factor(v: float, inc: bool) -> float:
    """Colour/contrast/brightness/sharpness blend factor (1: unchanged)."""
    if inc:
        return max(0.1, 1.0 + v / LEVEL_DENOM * 0.9)
    return abs(v) / LEVEL_DENOM * 1.8 + 0.1


def posterize_bits(v: float, inc: bool) -> int:
    """Bits kept: inc 4 → 0 as M grows, else 0 → 4 (timm: int() truncation)."""
    b = int((abs(v) / LEVEL_DENOM) * 4)
    return 4 - b if inc else b


def solarize_threshold(v: float, inc: bool) -> int:
    """Pixels >= threshold are inverted: inc 256 → 0 as M grows, else 0 → 256."""
    t = int((abs(v) / LEVEL_DENOM) * 256)
    return 256 - t if inc else t


def solarize_add(v: float) -> int:
    return int((abs(v) / LEVEL_DENOM) * 110)


# timm's suite names (with inc1) → the op names used here
TIMM_OPS = {
    "AutoContrast": "auto_contrast",
    "Equalize": "equalize",
    "Invert": "invert",
    "Rotate": "rotate",
    "PosterizeIncreasing": "posterize",
    "SolarizeIncreasing": "solarize",
    "SolarizeAdd": "solarize_add",
    "ColorIncreasing": "color",
    "ContrastIncreasing": "contrast",
    "BrightnessIncreasing": "brightness",
    "SharpnessIncreasing": "sharpness",
    "ShearX": "shear_x",
    "ShearY": "shear_y",
    "TranslateXRel": "translate_x",
    "TranslateYRel": "translate_y",
}


# --------------------------------------------------------------------- DALI side


def _posterize_mask(bits: int) -> np.ndarray:
    keep = min(8, max(0, bits))
    return np.array((0xFF << (8 - keep)) & 0xFF, dtype=np.uint8)  # 0 bits: black, as PIL


def _sharpness_kernel(factor: float) -> np.ndarray:
    """PIL's Sharpness: blend of the image and its smoothed copy, as one 3x3 kernel."""
    blur = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], dtype=np.float32) / 13
    ident = np.zeros((3, 3), dtype=np.float32)
    ident[1, 1] = 1
    return (factor * ident + (1 - factor) * blur).astype(np.float32)


def dali_suite(inc: bool = True) -> dict:
    """name → DALI augmentation whose parameter table is timm's level function at every 0.01 of M."""
    from nvidia.dali.auto_aug import augmentations as a  # DALI: optional (the torch loader runs without it)

    mags = np.arange(BINS, dtype=np.float64) / QUANT  # custom magnitudes: exact multiples of 0.01

    def f32(x):
        return np.array(x, dtype=np.float32)

    def aug(base, negate, to_param, name=None):
        return base.augmentation(
            mag_range=mags,
            randomly_negate=negate,
            mag_to_param=dali_compat.do_not_convert(to_param),
            **({"name": name} if name else {}),
        )

    return {
        "auto_contrast": a.auto_contrast,
        "equalize": a.equalize,
        "invert": a.invert,
        "rotate": aug(a.rotate, True, lambda v: f32(rotate_deg(v))),
        "posterize": aug(a.posterize, False, lambda v: _posterize_mask(posterize_bits(v, inc))),
        "solarize": aug(a.solarize, False, lambda v: f32(solarize_threshold(v, inc))),
        "solarize_add": aug(a.solarize_add, False, lambda v: np.uint8(solarize_add(v))),
        "color": aug(a.color, inc, lambda v: f32(enhance_factor(v, inc))),
        "contrast": aug(a.contrast, inc, lambda v: f32(enhance_factor(v, inc))),
        "brightness": aug(a.brightness, inc, lambda v: f32(enhance_factor(v, inc))),
        "sharpness": aug(a.sharpness, inc, lambda v: _sharpness_kernel(enhance_factor(v, inc))),
        "shear_x": aug(a.shear_x, True, lambda v: f32([shear(v), 0])),
        "shear_y": aug(a.shear_y, True, lambda v: f32([0, shear(v)])),
        "translate_x": aug(a.translate_x, True, lambda v: f32([translate_frac(v), 0])),
        "translate_y": aug(a.translate_y, True, lambda v: f32([0, translate_frac(v)])),
    }


def magnitude_bin(m: float) -> int:
    return int(round(m * QUANT))


def apply(images, spec: RandAugSpec, size: int, *, fill_value: float = 128, ops: tuple[str, ...] | None = None):
    """RandAugment on a DALI batch of uint8 HWC `size`×`size` images (pipeline with conditionals).

    Each of `spec.n` layers picks one op uniformly (with replacement, as timm) and applies it with
    probability `spec.p` at magnitude M, or M + N(0, mstd) clipped to [0, 10] drawn per layer.
    """
    from nvidia.dali import fn, types  # DALI: optional (the torch loader runs without it)
    from nvidia.dali import math as dmath
    from nvidia.dali.auto_aug import augmentations as a
    from nvidia.dali.auto_aug.core import select, signed_bin

    # AutoGraph (DALI conditionals) would trace every entry of the ops' 2002-entry parameter tables
    # (minutes per pipeline build); the tables and the ops' bodies have no data-dependent `if`
    suite = dali_compat.do_not_convert(dali_suite)(spec.inc)
    chosen = [
        dali_compat.do_not_convert(op.__call__)
        for op in [suite[k] for k in (ops or tuple(TIMM_OPS.values()))] + [a.identity]
    ]
    skip = len(chosen) - 1
    shape = (spec.n,) if spec.n > 1 else ()
    op_idx = fn.random.uniform(values=list(range(skip)), shape=shape, dtype=types.INT32)
    if spec.p < 1:
        on = fn.cast(fn.random.coin_flip(probability=spec.p, shape=shape), dtype=types.INT32)
        op_idx = on * op_idx + (1 - on) * skip
    if spec.mstd > 0:
        mag = fn.random.normal(mean=float(spec.m), stddev=float(spec.mstd), shape=shape)
        mag = dmath.clamp(mag, 0.0, LEVEL_DENOM)
        bins = fn.cast(mag * float(QUANT), dtype=types.INT32)  # DALI's cast rounds to nearest
    else:
        bins = magnitude_bin(spec.m)
    sbin = signed_bin(bins, shape=shape)
    kwargs = dict(shape=[size, size], fill_value=fill_value, interp_type=types.INTERP_LINEAR)
    for i in range(spec.n):
        idx, b = (op_idx[i], sbin[i]) if spec.n > 1 else (op_idx, sbin)
        images = select(chosen, idx, images, magnitude_bin=b, num_magnitude_bins=BINS, **kwargs)
    return images

"""Random erasing (aug.erase_prob/erase_mode/erase_count) against timm's RandomErasing, by statistics over many
draws with fixed seeds. The reference sampler below is timm 0.3.x random_erasing.py `_erase`,
transcribed with Python's `random` as timm uses it; ours draws from numpy, so the two are compared
as distributions (two-sample Kolmogorov-Smirnov), not value by value."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from scipy import stats

from hpctrain.config import load
from hpctrain.data.build import build_loaders
from hpctrain.data.erasing import apply_erasing, erase_boxes, erase_boxes_batch
from tests.helpers import DIGITS

H = W = 224
N = 20000


def timm_erase_box(rng: random.Random, prob=0.25, min_area=0.02, max_area=1 / 3, min_aspect=0.3):
    if rng.random() > prob:
        return None
    log_ratio = (math.log(min_aspect), math.log(1 / min_aspect))
    area = H * W
    for _ in range(10):
        target = rng.uniform(min_area, max_area) * area
        aspect = math.exp(rng.uniform(*log_ratio))
        h, w = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if w < W and h < H:
            return rng.randint(0, H - h), rng.randint(0, W - w), h, w
    return None


@pytest.fixture(scope="module")
def draws():
    ours = [erase_boxes(H, W, np.random.default_rng([7, i]), 0.25, 1)[0] for i in range(N)]
    ref = [timm_erase_box(random.Random(i)) for i in range(N)]
    return np.array([b for b in ours if b[2]]), np.array([b for b in ref if b]), len([b for b in ours if b[2]])


@pytest.mark.slow
def test_a_quarter_of_samples_get_one_box_inside_the_image(draws):
    ours, _, erased = draws
    assert abs(erased / N - 0.25) < 5 * math.sqrt(0.25 * 0.75 / N)  # 5 binomial sd = 0.015
    top, left, h, w = ours.T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= H).all() and (left + w <= W).all()
    assert (h < H).all() and (w < W).all()


def test_box_area_and_aspect_within_timm_bounds(draws):
    ours, _, _ = draws
    h, w = ours[:, 2].astype(float), ours[:, 3].astype(float)
    slack = (h + w) / 2 + 1  # rounding h and w to whole pixels moves the area by at most this
    assert (h * w >= 0.02 * H * W - slack).all() and (h * w <= H * W / 3 + slack).all()
    assert ((h - 0.5) / (w + 0.5) <= 1 / 0.3).all() and ((h + 0.5) / (w - 0.5) >= 0.3).all()
    assert (h * w).min() < 0.03 * H * W and (h * w).max() > 0.3 * H * W  # the whole range is used
    assert (h / w).min() < 0.35 and (h / w).max() > 1 / 0.35


def test_box_distribution_matches_timm(draws):
    ours, ref, _ = draws
    for col, name in [(2, "height"), (3, "width"), (0, "top"), (1, "left")]:
        p = stats.ks_2samp(ours[:, col], ref[:, col]).pvalue
        assert p > 1e-3, f"box {name}: KS p={p:.2g}"
    p = stats.ks_2samp(ours[:, 2] * ours[:, 3], ref[:, 2] * ref[:, 3]).pvalue
    assert p > 1e-3, f"box area: KS p={p:.2g}"


def test_several_boxes_split_the_area():
    boxes = [erase_boxes(H, W, np.random.default_rng([3, i]), 1.0, 3) for i in range(3000)]
    counts = [int((b[:, 2] > 0).sum()) for b in boxes]
    assert set(counts) == {1, 2, 3}
    three = [b for b, c in zip(boxes, counts) if c == 3]
    assert max(int((b[:, 2] * b[:, 3]).max()) for b in three) <= H * W / 9 + H


def test_batch_sampler_draws_timms_distribution_per_sample_key(draws):
    """erase_boxes_batch (the DALI loader's, one numpy draw per batch) against timm's sampler, as
    erase_boxes is; and sample i's boxes depend on its key alone, not on the batch around it."""
    _, ref, _ = draws
    keys = np.stack([np.full(N, 1), np.full(N, 7), np.zeros(N), np.arange(N), np.zeros(N)], axis=1)
    boxes = erase_boxes_batch(H, W, keys, 0.25, 1)[:, 0]
    ours = boxes[boxes[:, 2] > 0]
    assert abs(len(ours) / N - 0.25) < 5 * math.sqrt(0.25 * 0.75 / N)
    top, left, h, w = ours.T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= H).all() and (left + w <= W).all()
    assert (h < H).all() and (w < W).all()
    for col, name in [(2, "height"), (3, "width"), (0, "top"), (1, "left")]:
        p = stats.ks_2samp(ours[:, col], ref[:, col]).pvalue
        assert p > 1e-3, f"box {name}: KS p={p:.2g}"
    p = stats.ks_2samp(ours[:, 2] * ours[:, 3], ref[:, 2] * ref[:, 3]).pvalue
    assert p > 1e-3, f"box area: KS p={p:.2g}"
    assert np.array_equal(erase_boxes_batch(H, W, keys[5:9], 0.25, 1)[:, 0], boxes[5:9])
    assert np.array_equal(erase_boxes_batch(H, W, keys[[8, 3]], 0.25, 1)[:, 0], boxes[[8, 3]])


def test_batch_sampler_splits_the_area_between_several_boxes_as_the_per_sample_one():
    keys = np.stack([np.full(3000, 1), np.full(3000, 3), np.zeros(3000), np.arange(3000), np.zeros(3000)], axis=1)
    batch = erase_boxes_batch(H, W, keys, 1.0, 3)
    single = [erase_boxes(H, W, np.random.default_rng([3, i]), 1.0, 3) for i in range(3000)]
    counts = [(b[..., 2] > 0).sum(axis=-1) for b in (batch, np.stack(single))]
    assert set(counts[0].tolist()) == {1, 2, 3}
    assert stats.chisquare(np.bincount(counts[0])[1:], np.bincount(counts[1])[1:]).pvalue > 1e-3
    areas = [(b[..., 2] * b[..., 3])[b[..., 2] > 0] for b in (batch, np.stack(single))]
    assert stats.ks_2samp(*areas).pvalue > 1e-3


@pytest.mark.parametrize("mode", ["pixel", "rand", "const"])
def test_fill_values(mode):
    x = torch.full((64, 3, 32, 32), 7.0)
    boxes = torch.from_numpy(np.stack([erase_boxes(32, 32, np.random.default_rng([1, i]), 1.0, 1) for i in range(64)]))
    apply_erasing(x, boxes, torch.arange(64) * 1000, mode)
    inside = torch.zeros_like(x, dtype=torch.bool)
    for i, (t, lf, h, w) in enumerate(boxes[:, 0].tolist()):
        inside[i, :, t : t + h, lf : lf + w] = True
    assert (x[~inside] == 7.0).all()
    vals = x[inside]
    if mode == "const":
        assert (vals == 0).all()
    elif mode == "pixel":  # per-value N(0, 1): tens of thousands of values
        assert abs(vals.mean()) < 0.05 and abs(vals.std() - 1) < 0.05
        assert stats.kstest(vals.numpy(), "norm").pvalue > 1e-3
    else:  # one colour per channel and box
        for i, (t, lf, h, w) in enumerate(boxes[:, 0].tolist()):
            box = x[i, :, t : t + h, lf : lf + w].reshape(3, -1)
            assert (box == box[:, :1]).all()


@pytest.mark.slow
def test_torch_loader_erases_after_normalisation(digits_root):
    def batch(*sets):
        cfg = load(DIGITS, [f"data.root={digits_root}", "data.loader=torch", *sets])
        train, _ = build_loaders(cfg, 0, 1, torch.device("cpu"))
        train.set_epoch(1, start=2)
        return next(iter(train))[0]

    plain = batch()
    a, b = batch("aug.erase_prob=0.5"), batch("aug.erase_prob=0.5")
    assert torch.equal(a, b)  # fixed by (seed, epoch, sample)
    changed = (a != plain).flatten(1).any(1)
    assert 0.2 < changed.float().mean() < 0.8
    diff = a[a != plain]  # erased values: N(0,1) in normalised units, unlike the [-1, 1] image
    assert abs(diff.mean()) < 0.1 and abs(diff.std() - 1) < 0.1 and diff.abs().max() > 2

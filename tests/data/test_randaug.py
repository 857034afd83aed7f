"""RandAugment on timm's 0-10 scale (data/randaug.py) and the random-resized-crop sampling (DALI, CPU)."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

from hpctrain.config import ConfigError, load
from hpctrain.data import randaug
from hpctrain.data.randaug import RandAugSpec, parse_randaugment

# --------------------------------------------------------------------------- parsing (no DALI)


def test_specs_parse_as_timm_reads_them():
    assert parse_randaugment("") is None
    assert parse_randaugment("2,9") == RandAugSpec(2, 9.0, 0.0, True)
    assert parse_randaugment("rand-m9-mstd0.5-inc1") == RandAugSpec(2, 9.0, 0.5, True)
    assert parse_randaugment("rand-m10-n3") == RandAugSpec(3, 10.0, 0.0, False)  # timm: inc0 by default
    assert parse_randaugment("rand-n2-m10-p1").p == 1.0  # big_vision's randaug(2,10): every op applies


@pytest.mark.parametrize(
    "spec, match",
    [
        ("2,11", r"M=11 is outside 0\.\.10"),
        ("2,-1", "outside 0..10"),
        ("rand-m30", "outside 0..10"),
        ("two", "is not 'N,M'"),
        ("rand-m9-w0", "'w0' is not supported"),
        ("rand-m-n2", "has no number"),
        ("0,9", "N .* must be >= 1"),
        ("rand-m9-p0", "p must be in"),
    ],
)
def test_bad_specs_are_one_line_config_errors(spec, match):
    with pytest.raises(ConfigError, match=match) as e:
        load(None, [f"aug.randaugment={spec}"])
    assert "\n" not in str(e.value)


def test_torch_loader_refuses_randaugment():
    with pytest.raises(ConfigError, match="data.loader=dali"):
        load(None, ["aug.randaugment=2,9", "data.loader=torch"])


# --------------------------------------------------------------------------- DALI parameter tables

dali = pytest.importorskip("nvidia.dali")


def applied(name: str, m: float, sign: int = 1, inc: bool = True):
    """The parameter the DALI augmentation applies at magnitude m (its table at m's bin, signed)."""
    aug = randaug.dali_suite(inc)[name]
    mag = aug.mag_range[randaug.magnitude_bin(m)]
    assert aug.randomly_negate or sign == 1
    return aug.mag_to_param(sign * mag)


def kernel_factor(k) -> float:
    """The PIL Sharpness factor of a 3x3 kernel factor*identity + (1-factor)*smooth."""
    return float((k[1, 1] - 5 / 13) / (1 - 5 / 13))


# timm's values (auto_augment.py level functions, _LEVEL_DENOM 10, translate_pct 0.45) at M9 / M10
@pytest.mark.parametrize(
    "m, rot, shr, trans, bits, thresh, add, enh",
    [
        (9, 27.0, 0.27, 0.405, 1, 26, 99, 0.81),
        (10, 30.0, 0.30, 0.45, 0, 0, 110, 0.9),
    ],
)
def test_largest_parameter_equals_timms(m, rot, shr, trans, bits, thresh, add, enh):
    for s in (1, -1):
        assert applied("rotate", m, s) == pytest.approx(s * rot)
        assert applied("shear_x", m, s).tolist() == pytest.approx([s * shr, 0])
        assert applied("shear_y", m, s).tolist() == pytest.approx([0, s * shr])
        assert applied("translate_x", m, s).tolist() == pytest.approx([s * trans, 0])  # × image width
        assert applied("translate_y", m, s).tolist() == pytest.approx([0, s * trans])
        for name in ("color", "contrast", "brightness"):
            assert applied(name, m, s) == pytest.approx(1 + s * enh)
        assert kernel_factor(applied("sharpness", m, s)) == pytest.approx(1 + s * enh, abs=1e-5)
    assert bin(int(applied("posterize", m))).count("1") == bits  # bits kept
    assert applied("solarize", m) == thresh
    assert int(applied("solarize_add", m)) == add


def test_suite_is_timms_increasing_suite():
    assert set(randaug.dali_suite()) == set(randaug.TIMM_OPS.values())
    assert len(randaug.TIMM_OPS) == 15  # timm _RAND_INCREASING_TRANSFORMS, no Cutout, no identity


def test_non_increasing_variants():
    assert bin(int(applied("posterize", 10, inc=False))).count("1") == 4
    assert applied("solarize", 10, inc=False) == 256
    assert applied("color", 10, inc=False) == pytest.approx(1.9)
    assert applied("color", 0, inc=False) == pytest.approx(0.1)


# --------------------------------------------------------------------------- pixels


def bar_image(size: int = 96) -> np.ndarray:
    img = np.zeros((size, size, 3), np.uint8)
    img[size // 2 - 3 : size // 2 + 3, 12 : size - 12] = 255  # a horizontal bar through the centre
    return img


def bar_angle(img: np.ndarray) -> float:
    """Orientation (degrees, in (-90, 90]) of the bright pixels' principal axis."""
    ys, xs = np.nonzero(img[..., 0] > 128)
    c = np.cov(np.stack([xs, -ys]).astype(float))
    return math.degrees(0.5 * math.atan2(2 * c[0, 1], c[0, 0] - c[1, 1]))


def run_rotations(spec: RandAugSpec, batch: int) -> list[float]:
    from nvidia.dali import fn, pipeline_def, types

    img = bar_image()

    @pipeline_def(batch_size=batch, num_threads=1, device_id=None, seed=7, enable_conditionals=True)
    def pipe():
        x = fn.external_source(source=lambda: [img] * batch, layout="HWC", dtype=types.UINT8)
        return randaug.apply(x, spec, img.shape[0], fill_value=0, ops=("rotate",))

    p = pipe()
    p.build()
    (out,) = p.run()
    return [bar_angle(np.asarray(out[i])) for i in range(batch)]


def test_rotation_at_m10_turns_the_image_by_30_degrees():
    angles = run_rotations(RandAugSpec(1, 10, p=1), batch=8)
    assert all(abs(abs(a) - 30) < 1.0 for a in angles), angles
    assert min(angles) < 0 < max(angles)  # timm's random sign


def test_magnitude_noise_spreads_the_rotation_and_clips_at_m10():
    angles = np.abs(run_rotations(RandAugSpec(1, 9, mstd=0.5, p=1), batch=64))
    assert np.all(angles < 30.0 + 1.0)  # clipped to M10
    assert abs(angles.mean() - 27) < 1.0 and 0.8 < angles.std() < 2.2  # 3°/M × 0.5, clipped above 30°


def test_each_op_applies_with_probability_one_half():
    angles = np.abs(run_rotations(parse_randaugment("rand-n1-m10"), batch=128))  # timm's p0.5
    rotated = np.mean(angles > 15)
    assert 0.35 < rotated < 0.65 and np.all((angles < 1) | (abs(angles - 30) < 1))


# --------------------------------------------------------------------------- random-resized-crop


def timm_rrc_boxes(w: int, h: int, n: int, scale=(0.08, 1.0)) -> np.ndarray:
    """(w, h) of n crops drawn by timm/torchvision's RandomResizedCrop rule (torch_loader's copy)."""
    from hpctrain.data.torch_loader import random_resized_crop_box

    rng = np.random.default_rng(0)
    boxes = [random_resized_crop_box(w, h, rng, scale) for _ in range(n)]
    return np.array([(x1 - x0, y1 - y0) for x0, y0, x1, y1 in boxes], float)


def dali_rrc_boxes(w: int, h: int, n: int, scale_min: float = 0.08) -> np.ndarray:
    from nvidia.dali import fn, pipeline_def, types
    from PIL import Image

    from hpctrain.data.dali import crop_args

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8)).save(
        buf, format="JPEG", quality=30
    )
    data = np.frombuffer(buf.getvalue(), np.uint8)
    batch = 500

    @pipeline_def(batch_size=batch, num_threads=2, device_id=None, seed=3)
    def pipe():
        j = fn.external_source(source=lambda: [data] * batch, dtype=types.UINT8, ndim=1)
        return fn.decoders.image_random_crop(j, device="cpu", **crop_args(scale_min))

    p = pipe()
    p.build()
    shapes = []
    for _ in range(n // batch):
        (out,) = p.run()
        shapes += [out[i].shape() for i in range(batch)]
    return np.array([(s[1], s[0]) for s in shapes], float)


def ks(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic."""
    grid = np.sort(np.concatenate([a, b]))
    return float(
        np.max(
            np.abs(
                np.searchsorted(np.sort(a), grid, "right") / len(a)
                - np.searchsorted(np.sort(b), grid, "right") / len(b)
            )
        )
    )


@pytest.mark.parametrize("w, h", [(300, 300), (400, 200)])
def test_dali_crop_area_and_aspect_follow_timms_rule(w, h):
    n = 2000
    d, t = dali_rrc_boxes(w, h, n), timm_rrc_boxes(w, h, n)
    for f in (lambda b: b[:, 0] * b[:, 1] / (w * h), lambda b: np.log(b[:, 0] / b[:, 1])):
        # KS critical value at alpha=0.001 for two samples of 2000 is 1.95 * sqrt(2/2000) = 0.062
        assert ks(f(d), f(t)) < 0.062
    if w == h:  # the check tells log-uniform from uniform aspect sampling (no ratio filtered here)
        lin = np.random.default_rng(1).uniform(3 / 4, 4 / 3, n)
        assert ks(np.log(d[:, 0] / d[:, 1]), np.log(lin)) > 0.062


def test_deit_suite_with_noise_runs_on_a_batch():
    from nvidia.dali import fn, pipeline_def, types

    img = np.asarray(np.random.default_rng(0).integers(0, 255, (48, 48, 3)), np.uint8)

    @pipeline_def(batch_size=16, num_threads=1, device_id=None, seed=5, enable_conditionals=True)
    def pipe():
        x = fn.external_source(source=lambda: [img] * 16, layout="HWC", dtype=types.UINT8)
        return randaug.apply(x, parse_randaugment("rand-m9-mstd0.5-inc1"), 48)

    p = pipe()
    p.build()
    out = [np.asarray(t) for t in p.run()[0]]
    assert all(o.shape == img.shape for o in out)
    assert 4 <= sum(not np.array_equal(o, img) for o in out) <= 16  # 1 - 0.5^2 of them change

"""FLOP counter and MFU arithmetic."""

from __future__ import annotations

import pytest

from hpctrain import flops
from hpctrain.config import load


def test_vit_b16_224_forward_is_17_57_gmac():
    cfg = load(data={"model": {"arch": "vit_base", "img_size": 224, "patch_size": 16}})
    f = flops.model_flops(cfg.model)
    assert f.fwd_macs / 1e9 == pytest.approx(17.57, rel=0.01)
    # docs/performance.md: ≈ 105 GFLOP per trained image (2 FLOPs per MAC, forward + backward = 3×)
    assert f.train_flops / 1e9 == pytest.approx(105.4, rel=0.01)
    assert f.train_flops == 6 * f.fwd_macs


def test_other_shapes_follow_the_formula():
    # ViT-S/16 (timm/fvcore: 4.6 GMAC) and ViT-L/16 (61.6 GMAC) at 224²
    s = flops.model_flops(load(data={"model": {"arch": "vit_small"}}).model)
    large = flops.model_flops(load(data={"model": {"arch": "vit_large"}}).model)
    assert s.fwd_macs / 1e9 == pytest.approx(4.6, rel=0.02)
    assert large.fwd_macs / 1e9 == pytest.approx(61.6, rel=0.01)
    # global average pooling drops the class token: a little less attention and MLP work
    gap = flops.model_flops(load(data={"model": {"arch": "vit_base", "pool": "avg"}}).model)
    base = flops.model_flops(load(data={"model": {"arch": "vit_base"}}).model)
    assert gap.fwd_macs < base.fwd_macs
    # hand count of a one-block model: 4 patches + class token, width 8, MLP 16, 2 classes, 4×4 img
    macs = flops.vit_macs(img_size=4, patch_size=2, depth=1, width=8, mlp_ratio=2.0, num_classes=2)
    n = 5
    assert macs == 4 * 8 * 12 + (n * 8 * 24 + 2 * n * n * 8 + n * 8 * 8 + 2 * n * 8 * 16) + 8 * 2


def test_mfu_arithmetic():
    # 4,100 images/s of ViT-B/16 on one H200: 43.7 % MFU against the 989 TFLOP/s dense-bf16 spec
    # peak (docs/observability.md's 55 % is of the ~790 TFLOP/s a large matmul reaches there:
    # tests/train/observe/test_speed.py)
    train = flops.model_flops(load(data={"model": {"arch": "vit_base"}}).model).train_flops
    peak, source = flops.peak_tflops("NVIDIA H200")
    assert peak == 989.0 and "datasheet" in source
    assert flops.mfu(4100, train, peak) == pytest.approx(0.437, abs=0.005)
    # per device: 8 GPUs at 8× the images is the same utilisation
    assert flops.mfu(8 * 4100, train, peak, devices=8) == pytest.approx(flops.mfu(4100, train, peak))
    assert flops.mfu(1.0, 1e12, 2.0) == 0.5
    assert flops.mfu(100, train, None) is None


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100 80GB PCIe", 312.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA GH200 480GB", 989.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA L4", 121.0),
        ("NVIDIA H200 NVL", 835.0),
        ("NVIDIA H100 NVL", 835.0),
    ],
)
def test_peak_table_matches_device_names(name, peak):
    assert flops.peak_tflops(name)[0] == peak


def test_h200_nvl_is_not_an_h200_sxm():
    """The H200 NVL (a 600 W PCIe card) has a lower dense bf16 peak than the H200 SXM, though its
    name contains "H200": exact product names first, each with its datasheet figure and source."""
    sxm, sxm_source = flops.peak_tflops("NVIDIA H200")
    nvl, nvl_source = flops.peak_tflops("NVIDIA H200 NVL")
    assert (sxm, nvl) == (989.0, 835.0)
    assert sxm_source.startswith("H200 SXM: ") and "1,979" in sxm_source and "h200 datasheet" in sxm_source
    assert nvl_source.startswith("H200 NVL: ") and "1,671" in nvl_source
    assert flops.achievable_tflops("NVIDIA H200") == 790.0 and flops.achievable_tflops("NVIDIA H200 NVL") is None
    products = {p.product for p in flops.PEAKS}
    assert {"H100 SXM", "H100 PCIe", "H100 NVL", "H200 SXM", "H200 NVL", "A100 SXM", "A100 PCIe"} <= products
    # a name that is no exact product falls back to its most specific family, and says so
    peak, source = flops.peak_tflops("NVIDIA H200 NVL 141GB")
    assert peak == 835.0 and "not an exact name" in source and "--peak-tflops" in source


def test_unknown_device_says_what_to_do():
    peak, source = flops.peak_tflops("Tesla K80")
    assert peak is None and "--peak-tflops" in source

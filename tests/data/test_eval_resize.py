"""data.eval_resize=squash: vit_jax evaluates on the whole image resized to img_size² (input_pipeline.py:
212-213, `tf.image.resize(im, [image_size, image_size])`), not timm's short-side resize and centre crop.
Both loaders, against PIL's resize of the whole image written out here."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from hpctrain.config import load
from hpctrain.data.build import build_loaders
from tests.data.dali_images import png_class_root


@pytest.fixture(scope="module")
def png_root(tmp_path_factory):
    """8 lossless 160×120 photo crops, one per class, train = val (4:3: a squash and a crop differ)."""
    return png_class_root(tmp_path_factory.mktemp("squash"), seed=5)


def first_val_batch(root, loader: str, *sets: str) -> np.ndarray:
    cfg = load(
        None,
        [
            f"data.root={root}",
            f"data.loader={loader}",
            "data.global_batch=8",
            "model.img_size=64",
            "model.num_classes=8",
            "data.mean=[0,0,0]",
            "data.std=[1,1,1]",
            "data.workers=1",
            *sets,
        ],
    )
    _, val = build_loaders(cfg, 0, 1, torch.device("cpu"))
    val.set_epoch(0)
    return next(iter(val))[0].numpy() * 255.0


@pytest.mark.slow
@pytest.mark.parametrize("loader", ["torch", "dali"])
def test_squash_resizes_the_whole_image_to_img_size(png_root, loader):
    if loader == "dali":
        pytest.importorskip("nvidia.dali")
    root, imgs = png_root
    whole = np.stack(
        [np.asarray(Image.fromarray(a).resize((64, 64), Image.BILINEAR)).transpose(2, 0, 1) for a in imgs]
    ).astype(np.float64)
    got = first_val_batch(root, loader, "data.eval_resize=squash")
    diff = np.abs(got - whole)
    if loader == "torch":  # the same PIL call
        assert diff.max() < 1e-3
    else:  # DALI's antialiased linear filter against PIL's, scaled 2.5× and 1.875×: measured mean 0.17,
        # 99.9th percentile 4, a few pixels up to 11 of 255 (filter supports differ at strong edges)
        assert diff.mean() < 0.3 and np.percentile(diff, 99.9) <= 5, (diff.mean(), np.percentile(diff, 99.9))
    crop = first_val_batch(root, loader)  # the default: short side 73, centre crop: not the whole image
    assert np.abs(crop - whole).mean() > 5.0
    assert load("configs/vit_b16_finetune_384.yaml").data.eval_resize == "squash"  # the ViT-384 recipe

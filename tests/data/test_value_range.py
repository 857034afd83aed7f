"""big_vision's value_range(-1, 1) is data.mean = data.std = 0.5: both loaders map a black pixel to
exactly -1 and a white one to exactly +1 (x/255, then (x - mean)/std), in train and eval."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hpctrain.config import load
from hpctrain.data.build import build_loaders


def _flat_pngs(root: Path) -> None:
    from PIL import Image

    for split in ("train", "val"):
        for cls, value in (("black", 0), ("white", 255)):
            d = root / split / cls
            d.mkdir(parents=True)
            for i in range(4):  # PNG: lossless, so the decoded pixels are exactly 0 and 255
                Image.fromarray(np.full((20, 28, 3), value, np.uint8)).save(d / f"{i}.png")


@pytest.mark.parametrize("loader", ["torch", "dali"])
def test_black_and_white_images_become_exactly_minus_one_and_one(tmp_path, loader):
    if loader == "dali":
        pytest.importorskip("nvidia.dali")
    _flat_pngs(tmp_path)
    s16 = load("configs/vit_s16_imagenet_90ep.yaml").data
    assert (s16.mean, s16.std) == ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))  # the big_vision recipe uses it
    cfg = load(
        None,
        [
            f"data.root={tmp_path}",
            f"data.loader={loader}",
            "data.global_batch=8",
            "data.workers=0",
            "model.img_size=16",
            "model.num_classes=2",
            "data.mean=[0.5,0.5,0.5]",
            "data.std=[0.5,0.5,0.5]",
        ],
    )
    train, val = build_loaders(cfg, 0, 1, torch.device("cpu"))
    for ld in (train, val):
        ld.set_epoch(0)
        for x, y in ld:
            for img, lbl in zip(x, y):
                if lbl < 0:
                    continue  # eval padding
                want = -1.0 if lbl == 0 else 1.0  # classes sorted: black = 0, white = 1
                assert torch.allclose(img, torch.full_like(img, want), rtol=0, atol=1e-6), (loader, lbl)

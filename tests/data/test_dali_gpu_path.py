"""The DALI loader's GPU-path defects, checked where the CPU can see them (docs/data.md):
random erasing's noise takes the configured shape, not a per-batch `images.shape()`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hpctrain.config import load
from hpctrain.data import dali
from hpctrain.data.build import build_loaders

pytest.importorskip("nvidia.dali")
CPU = torch.device("cpu")


def _erase_reading_shape(images, aug, boxes):
    """dali._erase before the change (the reference): the noise's shape read from the images."""
    from nvidia.dali import fn, types  # DALI: optional, skipped above when missing

    anchor, shape = boxes
    keep = fn.erase(images * 0.0 + 1.0, anchor=anchor, shape=shape, axis_names="HW", fill_value=0.0)
    size = images.shape(dtype=types.INT32)
    noise = fn.random.normal(device="cpu", shape=size, dtype=types.FLOAT)
    return images * keep + noise * (1.0 - keep)


def test_pixel_erasing_reads_no_shape_and_draws_the_same_noise(ident_root, monkeypatch):
    """The graph holds no shape operator (on GPU images it is a GPU→CPU edge each batch) and its
    batches equal, bit for bit, the graph that read the shape (DALI seeds its random operators in
    graph order: the noise operator keeps its place)."""
    cfg = load(
        None,
        [
            f"{k}={v}"
            for k, v in {
                "data.root": ident_root,
                "data.loader": "dali",
                "data.global_batch": 6,
                "data.workers": 2,
                "model.img_size": 24,
                "model.patch_size": 8,
                "model.num_classes": 36,
                "train.seed": 3,
                "aug.erase_prob": 0.9,
                "aug.erase_count": 2,
                "aug.erase_mode": "pixel",
            }.items()
        ],
    )
    train, _ = build_loaders(cfg, 0, 1, CPU)
    reader, _, _ = train._reader(1)

    def pipe():
        return dali.build_pipeline(
            True,
            "folder",
            reader,
            train.aug,
            batch_size=6,
            threads=2,
            device=CPU,
            seed=dali.pipeline_seed(3, 1, 0, 1),
            erase_source=train.erase_source(1),
        )

    new = pipe()
    with monkeypatch.context() as m:
        m.setattr(dali, "_erase", _erase_reading_shape)
        ref = pipe()
    assert b"_Shape" in ref.serialize() and b"_Shape" not in new.serialize()
    for b in range(3):
        (x, y), (xr, yr) = new.run(), ref.run()
        assert np.array_equal(x.as_array(), xr.as_array()), b
        assert np.array_equal(y.as_array(), yr.as_array()), b

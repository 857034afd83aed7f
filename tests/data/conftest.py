"""Small JPEG datasets for the loader tests, written once per session."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.data.dali_images import photo_crops, write_jpeg


@pytest.fixture(scope="session")
def ident_root(tmp_path_factory) -> Path:
    """36 train images, one per class (the label names the sample); 37 val images over the classes.

    Image sizes vary (portrait and landscape) so resize/crop paths are exercised.
    """
    root = tmp_path_factory.mktemp("ident")
    imgs = photo_crops(36 + 37, seed=1)
    for i in range(36):
        arr = imgs[i] if i % 3 else np.ascontiguousarray(imgs[i].transpose(1, 0, 2))
        write_jpeg(root / "train" / f"c{i:02d}" / f"t{i:03d}.jpg", arr)
    for j in range(37):
        write_jpeg(root / "val" / f"c{j % 36:02d}" / f"v{j:03d}.jpg", imgs[36 + j])
    return root

"""Image helpers for the data tests (real photo crops from scikit-image)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_jpeg(path: Path, arr: np.ndarray, quality: int = 90) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path, quality=quality)


def photo_crops(n: int, seed: int, w: int = 40, h: int = 30) -> list[np.ndarray]:
    """n real-photo crops (scikit-image's astronaut and coffee), resized to w×h."""
    from PIL import Image
    from skimage import data

    photos = [data.astronaut(), data.coffee(), data.chelsea()]
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = photos[i % len(photos)]
        y, x = int(rng.integers(0, p.shape[0] - 120)), int(rng.integers(0, p.shape[1] - 160))
        out.append(np.asarray(Image.fromarray(p[y : y + 120, x : x + 160]).resize((w, h), Image.BILINEAR)))
    return out


def png_class_root(root: Path, seed: int, w: int = 160, h: int = 120) -> tuple[Path, list[np.ndarray]]:
    """8 lossless w×h photo crops as PNGs (the decoders agree exactly), one per class, train = val."""
    from PIL import Image

    imgs = photo_crops(8, seed=seed, w=w, h=h)
    for i, a in enumerate(imgs):
        for split in ("train", "val"):
            (root / split / f"c{i}").mkdir(parents=True)
            Image.fromarray(a).save(root / split / f"c{i}" / f"{i}.png")
    return root, imgs

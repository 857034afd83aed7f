"""The 8×8 digits (1,797 real images) as a small ImageNet-layout folder.

It is the embedded default dataset: real labels, real learning, seconds per epoch on a CPU. The
images ship in the package (`digits.u8.gz`, 44 kB: scikit-learn's `load_digits()`, the test set of
the UCI "Optical Recognition of Handwritten Digits" data, E. Alpaydin and C. Kaynak, 1998, CC BY 4.0),
so writing them needs numpy and Pillow only: a login node's `hpctrain[report]` install has both
(matplotlib's), not scikit-learn.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

VAL_FRACTION = 0.2
SPLIT_SEED = 20240601
COUNT = 1797
# 1797 images × 64 pixels (uint8, 0..16, row-major), then 1797 labels (uint8, 0..9)
PACKED = Path(__file__).with_name("digits.u8.gz")


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images (1797, 8, 8) uint8 in 0..16, labels (1797,) uint8): sklearn's load_digits() values."""
    raw = np.frombuffer(gzip.decompress(PACKED.read_bytes()), dtype=np.uint8)
    return raw[: COUNT * 64].reshape(COUNT, 8, 8), raw[COUNT * 64 :]


def write_digits(out: str | Path, size: int = 32) -> dict[str, int]:
    """Write out/{train,val}/<digit>/<n>.png (upscaled RGB); returns image counts per split."""
    from PIL import Image  # Pillow: only to write the digits set (the login node's comes with matplotlib)

    pixels, target = load_digits()
    images = (pixels * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(images))
    n_val = int(len(images) * VAL_FRACTION)
    split = {int(i): ("val" if k < n_val else "train") for k, i in enumerate(order)}
    out = Path(out)
    counts = {"train": 0, "val": 0}
    for i, (img, label) in enumerate(zip(images, target)):
        part = split[i]
        d = out / part / str(int(label))
        d.mkdir(parents=True, exist_ok=True)
        pil = Image.fromarray(img, mode="L").resize((size, size), Image.BICUBIC).convert("RGB")
        pil.save(d / f"{i:04d}.png")
        counts[part] += 1
    return counts

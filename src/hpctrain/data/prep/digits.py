"""scikit-learn's 8×8 digits (1,797 real images) as a small ImageNet-layout folder.

It is the embedded default dataset: real labels, real learning, seconds per epoch on a CPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

VAL_FRACTION = 0.2
SPLIT_SEED = 20240601


def write_digits(out: str | Path, size: int = 32) -> dict[str, int]:
    """Write out/{train,val}/<digit>/<n>.png (upscaled RGB); returns image counts per split."""
    from PIL import Image  # PIL, scikit-learn (2 s): only to write the digits set
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(images))
    n_val = int(len(images) * VAL_FRACTION)
    split = {int(i): ("val" if k < n_val else "train") for k, i in enumerate(order)}
    out = Path(out)
    counts = {"train": 0, "val": 0}
    for i, (img, label) in enumerate(zip(images, digits.target)):
        part = split[i]
        d = out / part / str(int(label))
        d.mkdir(parents=True, exist_ok=True)
        pil = Image.fromarray(img, mode="L").resize((size, size), Image.BICUBIC).convert("RGB")
        pil.save(d / f"{i:04d}.png")
        counts[part] += 1
    return counts

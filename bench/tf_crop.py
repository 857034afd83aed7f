"""Crop-size figures of data.crop=tf_inception against TensorFlow's rule and timm's sampler.

On a 500×375 image at area 5-100 %: mean crop area and share under 25 % of the image for the test's
line-by-line transcription of TensorFlow's kernel (tests/data/test_tf_crop.py), hpctrain's numpy
sampler (PIL loader), its DALI-graph sampler (CPU pipeline) and timm's RandomResizedCrop; then the
two-sample KS statistics against the transcription at the tests' 2,000 draws (docs/recipes.md).

    python bench/tf_crop.py [--draws 20000]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=20000)
    args = ap.parse_args()

    from hpctrain.data.tf_crop import tf_inception_box
    from hpctrain.data.torch_loader import random_resized_crop_box
    from tests.data.test_tf_crop import dali_sizes, ks_area_aspect, reference_sizes, sizes, tf_reference_box

    w, h, n = 500, 375, args.draws
    rng, rnd = np.random.default_rng(0), random.Random(0)
    runs = {
        "TF transcription (test)": sizes([tf_reference_box(w, h, rnd) for _ in range(n)]),
        "tf_inception, numpy (PIL loader)": sizes([tf_inception_box(w, h, rng, (0.05, 1)) for _ in range(n)]),
        "tf_inception, DALI graph": dali_sizes((h, w, 3), n)[1],
        "timm RandomResizedCrop": sizes([random_resized_crop_box(w, h, rng, (0.05, 1)) for _ in range(n)]),
    }
    ref = reference_sizes(w, h)
    print(f"{w}×{h}, area 5-100 %, {n} draws each; KS against the transcription at 2000 draws")
    for name, s in runs.items():
        a = s.prod(1) / (w * h)
        ka, kr = ks_area_aspect(s[:2000], ref, w, h)
        print(
            f"  {name:34s} mean area {a.mean():.3f}  share < 25 % {(a < 0.25).mean():.3f}  "
            f"KS area {ka:.3f} aspect {kr:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

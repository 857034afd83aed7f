"""The demo's digits ship in the package: the same images and labels as scikit-learn's, written
with numpy and Pillow only."""

from __future__ import annotations

import numpy as np
import pytest

from hpctrain.data.prep.digits import load_digits, write_digits


def test_shipped_digits_are_scikit_learns():
    sklearn_datasets = pytest.importorskip("sklearn.datasets", reason="the reference copy: scikit-learn (dev extra)")
    ref = sklearn_datasets.load_digits()
    images, labels = load_digits()
    assert images.shape == (1797, 8, 8) and labels.shape == (1797,)
    assert np.array_equal(images, ref.images) and np.array_equal(labels, ref.target)


def test_write_digits_splits_every_image_once(tmp_path):
    counts = write_digits(tmp_path, size=16)
    assert counts == {"train": 1438, "val": 359}
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.png"))
    assert len(files) == 1797 and len({f.split("/")[-1] for f in files}) == 1797
    assert {f.split("/")[1] for f in files} == {str(d) for d in range(10)}

"""data.eval_splits=[minival]: big_vision's train[:99%] / train[99%:] on an ImageNet-layout folder,
held out by a hash of the file name (data/folder.py), the same for both loaders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hpctrain.config import ConfigError, load
from hpctrain.data.build import build_loaders
from hpctrain.data.folder import DataError, list_split, minival_split, train_val_listings
from tests.data.dali_images import write_jpeg

CPU = torch.device("cpu")


def _names(root: Path, per_class: dict[str, int]) -> None:
    for c, n in per_class.items():
        (root / "train" / c).mkdir(parents=True)
        for i in range(n):
            (root / "train" / c / f"{c}_{i:04d}.JPEG").write_bytes(b"")  # listing never decodes


@pytest.mark.parametrize("n, held", [(300, 3), (250, 2), (1000, 10)])  # n - round(0.99·n), TFDS's rule
def test_disjoint_sizes_99_1_and_deterministic(tmp_path, n, held):
    _names(tmp_path, {"a": n // 2, "b": n - n // 2})
    full = list_split(tmp_path, "train")
    train, mini = minival_split(full)
    assert len(mini) == held and len(train) == n - held
    assert not set(train.samples) & set(mini.samples)
    assert sorted(train.samples + mini.samples) == sorted(full.samples)
    assert list(train.samples) == sorted(train.samples) and list(mini.samples) == sorted(mini.samples)
    assert minival_split(list_split(tmp_path, "train")) == (train, mini)  # same names, same split
    assert train.classes == mini.classes == ("a", "b")


def test_held_out_images_are_spread_over_the_classes(tmp_path):
    """A hash order, like TFDS's shuffled one, not the last 1 % of the sorted list (one class only)."""
    _names(tmp_path, {"a": 1000, "b": 1000})
    _, mini = minival_split(list_split(tmp_path, "train"))
    per_class = np.bincount([lbl for _, lbl in mini.samples], minlength=2)
    assert per_class.sum() == 20 and per_class.min() >= 5


def test_too_small_a_train_set_is_refused(tmp_path):
    _names(tmp_path, {"a": 20})
    with pytest.raises(DataError, match="too few for a 1 % minival"):
        train_val_listings(tmp_path, "minival")


def _jpeg_folder(root: Path, n_per_class: int) -> None:
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        for i in range(n_per_class):
            write_jpeg(root / "train" / c / f"{i:03d}.jpg", rng.integers(0, 255, (12, 12, 3), np.uint8))


def _cfg(root: Path, loader: str, *extra: str):
    return load(
        None,
        [
            f"data.root={root}",
            f"data.loader={loader}",
            "data.global_batch=8",
            "data.workers=0",
            "model.img_size=8",
            "model.patch_size=8",
            "model.num_classes=2",
            "data.eval_splits=[minival]",
            *extra,
        ],
    )


@pytest.mark.parametrize("loader", ["torch", "dali"])
def test_both_loaders_train_on_99_and_evaluate_on_the_same_1(tmp_path, loader):
    if loader == "dali":
        pytest.importorskip("nvidia.dali")
    _jpeg_folder(tmp_path, 100)
    want_train, want_mini = minival_split(list_split(tmp_path, "train"))
    train, val = build_loaders(_cfg(tmp_path, loader), 0, 1, CPU)
    got = [ld.dataset.listing if loader == "torch" else ld.listing for ld in (train, val)]
    assert got == [want_train, want_mini] and len(want_mini) == 2 and len(want_train) == 198
    assert len(train) == 198 // 8
    val.set_epoch(0)
    labels = torch.cat([y for _, y in val])
    assert sorted(labels[labels >= 0].tolist()) == sorted(lbl for _, lbl in want_mini.samples)


def test_minival_with_shards_is_refused(tmp_path):
    pytest.importorskip("nvidia.dali")
    with pytest.raises(ConfigError, match="shards from `data pack` have no minival"):
        build_loaders(_cfg(tmp_path, "dali", "data.format=wds"), 0, 1, CPU)

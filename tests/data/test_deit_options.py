"""DeiT's data options in both loaders: bicubic resizing (data.interpolation), random erasing
(aug.erase_prob) and repeated augmentation (aug.repeated_aug) in DALI; resume exactness with all on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hpctrain.config import load
from hpctrain.data import erasing, sampling
from hpctrain.data.build import build_loaders
from hpctrain.data.torch_loader import train_transform, val_transform
from tests.data.dali_images import png_class_root

CPU = torch.device("cpu")
PIL_FILTER = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}


@pytest.fixture(scope="module")
def png_root(tmp_path_factory) -> tuple[Path, list[np.ndarray]]:
    """8 lossless 160×120 photo crops (PNG: the decoders agree exactly), one per class, train = val."""
    return png_class_root(tmp_path_factory.mktemp("png"), seed=3)


def loaders(root, loader, *sets, world=1, rank=0):
    # val: shorter side floor(64 / 0.888) = 72, so 160×120 → 96×72 and even margins: the centre crop
    # has no half-pixel to round, which DALI and PIL would round differently
    cfg = load(
        None,
        [
            f"data.root={root}",
            f"data.loader={loader}",
            "data.global_batch=8",
            "model.img_size=64",
            "data.crop_pct=0.888",
            "model.num_classes=8",
            "data.mean=[0,0,0]",
            "data.std=[1,1,1]",
            "data.workers=1",
            *sets,
        ],
    )
    return build_loaders(cfg, rank, world, CPU)


@pytest.mark.parametrize("interp", ["bilinear", "bicubic"])
def test_dali_resizes_as_pil_does(png_root, interp):
    """DALI's INTERP_CUBIC (antialiased) against PIL's BICUBIC resize of the same pixels: within 3 of
    255 everywhere, 0.3 on average; the other filter is ≥ 1 away on average (photo edges)."""
    pytest.importorskip("nvidia.dali")
    root, imgs = png_root
    _, val = loaders(root, "dali", f"data.interpolation={interp}")
    val.set_epoch(0)
    x = next(iter(val))[0].numpy() * 255.0
    for ref in ("bilinear", "bicubic"):
        p = np.stack([val_transform(Image.fromarray(a), 64, 0.888, ref).transpose(2, 0, 1) for a in imgs])
        diff = np.abs(x - p)
        if ref == interp:
            assert diff.max() <= 3 and diff.mean() < 0.3, (ref, diff.max(), diff.mean())
        else:
            assert diff.mean() > 1.0, (ref, diff.mean())


def test_torch_loader_uses_pils_bicubic(png_root):
    root, imgs = png_root
    train, val = loaders(root, "torch", "data.interpolation=bicubic")
    val.set_epoch(0)
    x = next(iter(val))[0].numpy() * 255.0
    want = np.stack([val_transform(Image.fromarray(a), 64, 0.888, "bicubic").transpose(2, 0, 1) for a in imgs])
    assert np.abs(x - want).max() < 1e-3
    img = Image.fromarray(imgs[0])
    box = (10, 5, 130, 100)
    a = np.asarray(img.resize((64, 64), Image.BICUBIC, box=box)).astype(int)
    b = np.asarray(img.resize((64, 64), Image.BILINEAR, box=box)).astype(int)
    assert np.abs(a - b).mean() > 1.0  # the filters differ on this image
    got = [train_transform(img, 64, np.random.default_rng(0), 1.0, 0.0, f) for f in ("bicubic", "bilinear")]
    ref = [np.asarray(img.resize((64, 64), PIL_FILTER[f], box=(0, 0, 160, 120))) for f in ("bicubic", "bilinear")]
    # scale_min=1 with a 4:3 image: the random-resized crop falls back to the centre crop of ratio 4/3
    assert np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1])


def test_dali_erases_the_boxes_of_each_sample_with_normal_noise(png_root):
    pytest.importorskip("nvidia.dali")
    root, _ = png_root
    plain_loader, _ = loaders(root, "dali")
    erased_loader, _ = loaders(root, "dali", "aug.erase_prob=0.6", "aug.erase_count=2")
    xs, masks = [], []
    for e in range(6):
        plain_loader.set_epoch(e)
        erased_loader.set_epoch(e)
        ((p, _),) = list(plain_loader)
        ((x, _),) = list(erased_loader)
        idx = erased_loader.epoch_indices(e)
        keys = [[1, erased_loader.seed, e, int(idx[j]), 0] for j in range(8)]  # (folder, seed, epoch, index, copy)
        for j, boxes in enumerate(erasing.erase_boxes_batch(64, 64, np.array(keys), 0.6, 2)):
            m = torch.zeros(3, 64, 64, dtype=torch.bool)
            for t, lf, h, w in boxes.tolist():
                m[:, t : t + h, lf : lf + w] = True
            assert torch.equal(x[j][~m], p[j][~m])  # untouched outside the boxes (the crop is the same)
            if m.any():
                assert (x[j][m] != p[j][m]).float().mean() > 0.99
            xs.append(x[j][m])
            masks.append(bool(m.any()))
    vals = torch.cat(xs)
    assert abs(vals.mean()) < 0.05 and abs(vals.std() - 1) < 0.05  # N(0,1) in normalised units
    assert 0.3 < np.mean(masks) < 0.9  # 48 samples at reprob 0.6


def test_repeated_aug_on_fewer_than_256_images_is_refused(png_root):
    """DeiT's epoch is ⌊n/256⌋·256 samples: 8 images make none, said in one line."""
    pytest.importorskip("nvidia.dali")
    root, _ = png_root
    with pytest.raises(Exception, match="no full global batch"):
        loaders(root, "dali", "aug.repeated_aug=3")


@pytest.mark.slow
def test_resume_is_exact_with_deit_options_on(digits_root):
    """DALI and torch: epoch e from batch k equals the uninterrupted epoch's batches k.. with bicubic,
    erasing and repeated augmentation on (DALI rebuilds the epoch's pipeline and discards k batches),
    and the labels are those of the repeated list."""
    pytest.importorskip("nvidia.dali")
    from tests.helpers import DIGITS

    sets = ["data.interpolation=bicubic", "aug.erase_prob=0.5", "aug.repeated_aug=3"]
    for kind, workers in (("dali", 1), ("torch", 0)):  # torch: no fork of a process running DALI threads
        cfg = load(DIGITS, [f"data.root={digits_root}", f"data.loader={kind}", f"data.workers={workers}", *sets])
        a, _ = build_loaders(cfg, 1, 2, CPU)
        b, _ = build_loaders(cfg, 1, 2, CPU)
        a.set_epoch(1)
        b.set_epoch(1, 17)
        full, resumed = list(a), list(b)
        assert len(full) == 1438 // 256 * 256 // 64 and len(resumed) == len(full) - 17
        for (xa, ya), (xb, yb) in zip(full[17:], resumed):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
        want = sampling.train_batches(1438, 64, 1, 2, cfg.train.seed, 1, repeats=3)
        listing = a.listing if kind == "dali" else a.dataset.listing
        labels = [listing.samples[int(i)][1] for i in np.concatenate(want)]
        assert torch.cat([y for _, y in full]).tolist() == labels, kind


def test_repeated_aug_on_shards_is_refused_in_one_line(tmp_path):
    pytest.importorskip("nvidia.dali")
    from hpctrain.config import ConfigError

    with pytest.raises(ConfigError, match="aug.repeated_aug needs .* data.format=folder"):
        loaders(tmp_path, "dali", "data.format=wds", "aug.repeated_aug=3")

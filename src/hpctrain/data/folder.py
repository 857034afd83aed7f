"""ImageNet-layout folders: `root/{train,val}/<class>/<image>`, classes in sorted order.

Torch-free: `prepare-imagenet`, `data pack` and the DALI file lists share this listing, so every
loader sees the same classes, the same sample order and the same exclusions.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from hpctrain.errors import UserError

IMAGE_EXTS = (".jpeg", ".jpg", ".png", ".bmp", ".webp", ".tif", ".tiff")


class DataError(UserError, RuntimeError):
    """Missing, empty or corrupt data, phrased with the path and the fix."""


@dataclass(frozen=True)
class Listing:
    root: Path  # the split folder
    classes: tuple[str, ...]
    samples: tuple[tuple[str, int], ...]  # (path relative to root, label)

    def __len__(self) -> int:
        return len(self.samples)


def read_exclusions(path: str | os.PathLike | None) -> set[str]:
    """Relative paths (to the dataset root or the split) listed one per line; '#' comments."""
    if not path:
        return set()
    p = Path(path)
    if not p.is_file():
        raise DataError(
            f"data.exclude_file {str(p)!r} does not exist; write it with "
            "`hpctrain data prepare-imagenet ROOT --exclude-bad` or clear the option"
        )
    out = set()
    for line in p.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.add(line)
    return out


def class_folders(base: Path) -> tuple[str, ...]:
    """The class names of a split folder (its sub-folders, sorted: the labels' order). Reads no image,
    so `submit` can count a dataset's classes on the login node."""
    found = tuple(sorted(d.name for d in base.iterdir() if d.is_dir()))
    if not found:
        raise DataError(f"{base} has no class folders: expected {base.name}/<class>/<images>")
    return found


def class_mismatch(where: str | os.PathLike, found: int, num_classes: int) -> str | None:
    """The one line every loader and `submit` refuse a head of another class count with (a head wider
    than the data trains dead logits, a narrower one fails on the first label past it); None: they agree."""
    if found == num_classes:
        return None
    return f"{where} has {found} classes but model.num_classes={num_classes}; set --set model.num_classes={found}"


def list_split(
    root: str | os.PathLike,
    split: str,
    exclude: set[str] | frozenset = frozenset(),
    classes: tuple[str, ...] | None = None,
) -> Listing:
    """List `root/split` as (relative path, label) in sorted order, without excluded files."""
    base = Path(root) / split
    if not base.is_dir():
        raise DataError(
            f"{base} is not a folder: data.root must hold {split}/<class>/<images> "
            "(make a small one with `hpctrain data digits OUT`)"
        )
    found = class_folders(base)
    if classes is None:
        classes = found
    elif set(found) - set(classes):
        extra = sorted(set(found) - set(classes))[:5]
        raise DataError(f"{base} has classes that train/ lacks: {extra}; the splits must share classes")
    index = {c: i for i, c in enumerate(classes)}
    samples = []
    for c in found:
        for dirpath, dirnames, filenames in os.walk(base / c):
            dirnames.sort()
            for f in sorted(filenames):
                if not f.lower().endswith(IMAGE_EXTS):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), base)
                if rel in exclude or f"{split}/{rel}" in exclude:
                    continue
                samples.append((rel, index[c]))
    if not samples:
        raise DataError(f"{base} holds no images ({', '.join(IMAGE_EXTS)})")
    return Listing(base, classes, tuple(samples))


MINIVAL_PERCENT = 1  # big_vision vit_s16_i1k.py: train on train[:99%], evaluate on train[99%:]


def _key_rank(rel: str) -> bytes:
    return hashlib.blake2b(rel.encode(), digest_size=8).digest()


def minival_split(listing: Listing, percent: int = MINIVAL_PERCENT) -> tuple[Listing, Listing]:
    """(train without the held-out images, the held-out minival) from a train listing.

    TFDS stores examples in an order shuffled by a hash of their key and `train[99%:]` takes the last
    1 % of it, the boundary rounded to the closest integer (its `_pct_to_abs_closest`). A folder has
    no such order, so ours is the same idea on the file names: images ranked by BLAKE2b of their
    path relative to train/, the last n - round(n·(100-percent)/100) held out. It depends only on the
    names (not on seeds, ranks or loaders), so every loader and world size holds out the same images;
    both listings keep the sorted order."""
    n = len(listing)
    held_n = n - int(round((100 - percent) * n / 100.0))
    if held_n == 0 or held_n == n:
        raise DataError(
            f"{listing.root}: {n} images are too few for a {percent} % minival; use "
            "data.eval_splits=[val] or a larger train set"
        )
    ranked = sorted(range(n), key=lambda i: _key_rank(listing.samples[i][0]))
    held = set(ranked[n - held_n :])
    keep = tuple(s for i, s in enumerate(listing.samples) if i not in held)
    out = tuple(s for i, s in enumerate(listing.samples) if i in held)
    return Listing(listing.root, listing.classes, keep), Listing(listing.root, listing.classes, out)


def train_val_listings(
    root: str | os.PathLike, val_split: str, exclude: set[str] | frozenset = frozenset()
) -> tuple[Listing, Listing | None]:
    """The (train, eval) listings every folder loader uses: root/train and root/val (None when root
    has no val/), or, for `val_split="minival"`, root/train split by `minival_split`."""
    train, evals = train_eval_listings(root, (val_split,), exclude)
    return train, evals.get(val_split)


def train_eval_listings(
    root: str | os.PathLike, splits: tuple[str, ...] | list[str], exclude: set[str] | frozenset = frozenset()
) -> tuple[Listing, dict[str, Listing]]:
    """(train, {split: listing}) for the eval splits named (`data.eval_splits`, in that order): `val` is
    root/val (left out when root has no val/), `minival` the 1 % `minival_split` holds out of root/train,
    which train then lacks whatever else is evaluated."""
    train = list_split(root, "train", exclude)
    evals: dict[str, Listing] = {}
    if "minival" in splits:
        train, mini = minival_split(train)
    for split in splits:
        if split == "minival":
            evals[split] = mini
        elif (Path(root) / split).is_dir():
            evals[split] = list_split(root, split, exclude, classes=train.classes)
    return train, evals

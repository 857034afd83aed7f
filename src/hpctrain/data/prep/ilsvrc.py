"""`data pack --from ilsvrc2012 DIR`: ImageNet-1k read from the three official files, never extracted.

Extracting ILSVRC2012 writes 1.33 M files (twice the 150 GB on disk for a while), slow on the
parallel file systems packs run on. Instead the tars are indexed once: a tar member's bytes are
stored whole at `TarInfo.offset_data`, so the train tar (one uncompressed tar per class,
`n01440764.tar` …) and the inner tars give every JPEG's offset in the outer file (an inner
member's offset is relative to its tar's own data start), and a shard reads each by a seek.

Labels are those of the extracted folder (`data pack ROOT`, ImageFolder, timm): the index of
the WNID in sorted-WNID order. The devkit's ILSVRC2012_IDs are in another order and only name
the val images' classes: `ILSVRC2012_validation_ground_truth.txt` gives one ID per val image in
file-name order, `meta.mat`'s `synsets` turns an ID into its WNID (docs/data.md, "Getting
ImageNet in", names the source of this layout). Torch-free; scipy only to read meta.mat.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from hpctrain.data.folder import IMAGE_EXTS, DataError
from hpctrain.data.prep.imagenet import IMAGENET
from hpctrain.data.prep.source import ArchiveEntry, Source, SplitEntries

ILSVRC2012 = "ilsvrc2012"  # `data pack --from ilsvrc2012`
TRAIN_TAR = "ILSVRC2012_img_train.tar"
VAL_TAR = "ILSVRC2012_img_val.tar"
DEVKIT = "ILSVRC2012_devkit_t12.tar.gz"
META_MAT = "ILSVRC2012_devkit_t12/data/meta.mat"
VAL_TRUTH = "ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt"
MAPPING = "wnid_to_index.json"  # written beside the shards: each class's label

Span = tuple[str, int, int]  # (member name, offset of its bytes in the archive file, size)


def archive_paths(folder: str | os.PathLike) -> tuple[Path, Path, Path]:
    """The three official files in `folder`, or one line naming what is missing."""
    folder = Path(folder).resolve()
    paths = (folder / TRAIN_TAR, folder / VAL_TAR, folder / DEVKIT)
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise DataError(
            f"{folder} lacks {', '.join(missing)}: --from ilsvrc2012 reads the three official files "
            f"{TRAIN_TAR}, {VAL_TAR} and {DEVKIT} (image-net.org) from DIR"
        )
    return paths


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTS)


def _spans(tar: tarfile.TarFile, where: str, base: int = 0) -> list[Span]:
    """Every regular member of an uncompressed tar, its data offset shifted by `base`. A sparse
    member's bytes are not one span (the official tars have none)."""
    out = []
    for m in tar:
        if m.issparse():
            raise DataError(f"{where}: member {m.name} is a sparse file, which cannot be read in place")
        if m.isfile():
            out.append((m.name, base + m.offset_data, m.size))
    return out


def index_train(path: Path) -> dict[str, list[Span]]:
    """WNID → its images (name inside its class tar, offset in the outer file, size), reading
    only the tar headers."""
    out: dict[str, list[Span]] = {}
    with tarfile.open(path, "r:") as outer:
        for m in outer.getmembers():
            if not m.isfile():
                continue
            wnid, ext = os.path.splitext(os.path.basename(m.name))
            if ext != ".tar":
                raise DataError(f"{path}: member {m.name} is not a class tar: is this {TRAIN_TAR}?")
            inner_file = outer.extractfile(m)
            assert inner_file is not None  # a regular member
            with tarfile.open(fileobj=inner_file, mode="r:") as inner:
                out[wnid] = sorted(s for s in _spans(inner, f"{path} ({m.name})", m.offset_data) if _is_image(s[0]))
    if not out:
        raise DataError(f"{path} holds no class tars: is it {TRAIN_TAR}?")
    return out


def index_val(path: Path) -> list[Span]:
    """The val images in file-name order (the ground truth's order)."""
    with tarfile.open(path, "r:") as tar:
        return sorted(s for s in _spans(tar, str(path)) if _is_image(s[0]))


def read_devkit(path: Path) -> tuple[dict[int, str], list[int]]:
    """(ILSVRC2012_ID → WNID of the leaf synsets, the val images' IDs in file-name order), read
    from the devkit in memory."""
    with tarfile.open(path, "r:gz") as tar:
        try:
            mat = _member(tar, META_MAT)
            truth = _member(tar, VAL_TRUTH).decode().split()
        except KeyError as e:
            raise DataError(f"{path} lacks {e.args[0]}: is it {DEVKIT}?") from None
    return leaf_synsets(mat), [int(x) for x in truth]


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    f = tar.extractfile(name)
    if f is None:
        raise KeyError(name)
    return f.read()


def leaf_synsets(mat: bytes) -> dict[int, str]:
    """meta.mat's synsets with no children (the 1000 classes) as ILSVRC2012_ID → WNID."""
    try:
        # scipy: a heavy optional package, needed only here; the login node's import path never loads it
        from scipy.io import loadmat
    except ImportError:
        raise DataError(
            "reading the devkit's meta.mat needs scipy, which this install lacks: pip install 'hpctrain[data]'"
        ) from None
    synsets = loadmat(io.BytesIO(mat), squeeze_me=True)["synsets"]
    return {int(s["ILSVRC2012_ID"]): str(s["WNID"]) for s in synsets.reshape(-1) if int(s["num_children"]) == 0}


def archive_source(folder: str | os.PathLike, exclude: set[str], log=print) -> Source:
    """Train and val entries of the official files, labelled as the extracted folder would be."""
    train_tar, val_tar, devkit = archive_paths(folder)
    log(f"indexing {train_tar} (headers only)")
    by_class = index_train(train_tar)
    classes = tuple(sorted(by_class))
    train = [
        ArchiveEntry(rel, label, off, size)
        for label, wnid in enumerate(classes)
        for name, off, size in by_class[wnid]
        if not _excluded(rel := f"{wnid}/{name}", "train", exclude)
    ]
    ids, truth = read_devkit(devkit)
    unknown = sorted(set(classes) - set(ids.values()))
    if unknown:
        raise DataError(f"{train_tar} has classes the devkit's leaf synsets lack ({', '.join(unknown[:5])}): {devkit}")
    val = val_entries(val_tar, index_val(val_tar), truth, ids, classes, exclude)
    splits = {"train": SplitEntries(str(train_tar), classes, tuple(train))}
    if not train:
        raise DataError(f"{train_tar} holds no images")
    if val:
        splits["val"] = SplitEntries(str(val_tar), classes, tuple(val))
    log(f"{len(classes)} classes, {len(train):,} train and {len(val):,} val images in {Path(folder).resolve()}")
    note = count_note(len(classes), len(train), len(val))
    if note:
        log(note)
    return Source(str(Path(folder).resolve()), ILSVRC2012, splits)


def val_entries(
    val_tar: Path, spans: list[Span], truth: list[int], ids: dict[int, str], classes: tuple[str, ...], exclude: set[str]
) -> list[ArchiveEntry]:
    """The val images as `<wnid>/<file>` entries, in the extracted folder's order (class, name)."""
    if len(spans) != len(truth):
        raise DataError(
            f"{val_tar} holds {len(spans)} images but the devkit's ground truth has {len(truth)} lines: "
            "are they of the same release?"
        )
    index = {c: i for i, c in enumerate(classes)}
    out = []
    for (name, off, size), cid in zip(spans, truth):
        wnid = ids.get(cid)
        if wnid is None:
            raise DataError(f"the ground truth gives {name} class ID {cid}, which meta.mat's leaf synsets lack")
        if wnid not in index:
            raise DataError(
                f"the ground truth puts {name} in {wnid}, which {TRAIN_TAR} lacks: the splits must share classes"
            )
        rel = f"{wnid}/{os.path.basename(name)}"
        if not _excluded(rel, "val", exclude):
            out.append((wnid, rel, index[wnid], off, size))
    return [ArchiveEntry(*e[1:]) for e in sorted(out)]


def _excluded(rel: str, split: str, exclude: set[str]) -> bool:
    return rel in exclude or f"{split}/{rel}" in exclude


def count_note(classes: int, train: int, val: int) -> str | None:
    """One line when this copy is not the whole ImageNet-1k (a miniature, a partial download)."""
    have, want = (classes, train, val), (IMAGENET["classes"], IMAGENET["train"], IMAGENET["val"])
    if have == want:
        return None
    return (
        f"note: this copy has {classes:,} classes, {train:,} train and {val:,} val images; "
        f"ImageNet-1k has {want[0]:,}, {want[1]:,} and {want[2]:,}"
    )

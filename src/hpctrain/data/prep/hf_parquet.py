"""`data pack --from hf-parquet DIR`: Hugging Face's `imagenet-1k` parquet files read in place.

The dataset's parquet files (`data/train-*.parquet`, `data/validation-*.parquet`; the test
split's labels are -1, so it is left out) hold one row per image: `image`, a struct of the
file's `bytes` and its `path`, and `label`, the int64 class index, which for imagenet-1k is the
sorted-WNID index (docs/data.md, "Getting ImageNet in", names the source). An entry is
(file, row group, row); planning reads only the `label` and `image.path` columns, a shard's
worker reads the image bytes (data/prep/parquet.py). Each entry keeps the folder path the image
would have extracted (`<class>/<file name>`) and the folder's order (class, then file name), so
the shards are those of the extracted folder. The class names are WNIDs when DIR holds the
dataset's `classes.py` (its IMAGENET2012_CLASSES, in WNID order), else the labels' numbers.
Torch-free; pyarrow only through data/prep/parquet.py.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from hpctrain.data.folder import DataError
from hpctrain.data.prep import parquet
from hpctrain.data.prep.ilsvrc import count_note
from hpctrain.data.prep.source import ParquetEntry, Source, SplitEntries

HF_PARQUET = "hf-parquet"  # `data pack --from hf-parquet`
SPLIT_FILES = {"train": "train-*.parquet", "val": "validation-*.parquet"}  # our split → the dataset's
CLASSES_PY = "classes.py"
_WNID_KEY = re.compile(r'^\s*"(n\d{8})"\s*:', re.MULTILINE)


def parquet_files(folder: str | os.PathLike) -> tuple[Path, dict[str, list[str]]]:
    """(the folder holding the files: DIR/data or DIR, {split: file names}), or one line naming
    what is expected."""
    folder = Path(folder).resolve()
    for d in (folder / "data", folder):
        found = {s: sorted(p.name for p in d.glob(g) if p.is_file()) for s, g in SPLIT_FILES.items()}
        if found["train"]:
            return d, {s: names for s, names in found.items() if names}
    raise DataError(
        f"{folder} holds no {SPLIT_FILES['train']}, in data/ or itself: --from hf-parquet reads Hugging "
        f"Face's imagenet-1k parquet files, DIR/data/{SPLIT_FILES['train']} and "
        f"DIR/data/{SPLIT_FILES['val']} (or the same names in DIR)"
    )


def rows(path: Path) -> list[tuple[int, int, int, str]]:
    """(label, row group, row, image file name) of every row, from the label and path columns only."""
    pf = parquet.pq().ParquetFile(path)
    names = set(pf.schema_arrow.names)
    if parquet.IMAGE not in names or parquet.LABEL not in names:
        raise DataError(
            f"{path} has columns {', '.join(sorted(names))}: --from hf-parquet expects imagenet-1k's "
            f"{parquet.IMAGE} (struct of bytes, path) and {parquet.LABEL}"
        )
    out = []
    for g in range(pf.num_row_groups):
        t = pf.read_row_group(g, columns=[f"{parquet.IMAGE}.path", parquet.LABEL])
        labels = t.column(parquet.LABEL).to_pylist()
        paths = t.column(parquet.IMAGE).combine_chunks().field("path").to_pylist()
        for r, (label, p) in enumerate(zip(labels, paths)):
            if label is None or label < 0:
                raise DataError(f"{path} row group {g} row {r} has label {label}: is it the test split?")
            if not p:
                raise DataError(f"{path} row group {g} row {r} has no image path: is it imagenet-1k's parquet?")
            out.append((int(label), g, r, os.path.basename(p)))
    return out


def class_names(folder: Path, n: int) -> tuple[str, ...]:
    """The WNIDs of DIR's classes.py (when it has at least n, in sorted order), else the labels as
    4-digit numbers: the parquet files hold only the labels."""
    p = folder / CLASSES_PY
    wnids = _WNID_KEY.findall(p.read_text()) if p.is_file() else []
    if len(wnids) >= n and wnids == sorted(wnids):
        return tuple(wnids)
    return tuple(f"{i:04d}" for i in range(n))


def parquet_source(folder: str | os.PathLike, exclude: set[str], log=print) -> Source:
    """Train and validation rows as entries in the extracted folder's order, labels as stored."""
    where, files = parquet_files(folder)
    found = {s: [(row, name) for name in names for row in rows(where / name)] for s, names in files.items()}
    n = max(row[0][0] for row in found["train"]) + 1
    classes = class_names(Path(folder).resolve(), n)
    splits = {}
    for split, split_rows in found.items():
        out = []
        for (label, g, r, base), name in split_rows:
            if label >= len(classes):
                raise DataError(f"{where / name} row group {g} row {r} has label {label}, beyond train's {n} classes")
            rel = f"{classes[label]}/{base}"
            if rel not in exclude and f"{split}/{rel}" not in exclude:
                out.append(ParquetEntry(rel, label, name, g, r))
        out.sort(key=lambda e: (e.label, e.path))  # the folder's order: class, then file name
        if out:
            splits[split] = SplitEntries(str(where), classes, tuple(out))
    if "train" not in splits:
        raise DataError(f"every train image of {where} is excluded")
    counts = {s: len(splits[s]) if s in splits else 0 for s in SPLIT_FILES}
    root = Path(folder).resolve()
    log(f"{len(classes)} classes, {counts['train']:,} train and {counts['val']:,} val images in {where}")
    note = count_note(len(classes), counts["train"], counts["val"])
    if note:
        log(note)
    return Source(str(root), HF_PARQUET, splits)

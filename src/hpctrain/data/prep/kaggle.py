"""`data pack --from kaggle DIR`: Kaggle's `imagenet-object-localization-challenge` read in place.

Kaggle's download is the extracted train folder (ILSVRC/Data/CLS-LOC/train/<wnid>/<wnid>_<n>.JPEG)
with a flat val folder (ILSVRC/Data/CLS-LOC/val/ILSVRC2012_val_XXXXXXXX.JPEG) whose classes are
in LOC_val_solution.csv (the first WNID of each PredictionString: `prepare-imagenet --val-map`
reads it the same way, imagenet.read_val_map). Sorting val into class folders would move or copy
50,000 files; instead each val entry keeps the folder path it would have sorted (`<wnid>/<file>`)
and points at the flat file, so the shards are those of the sorted folder. Labels are the
sorted-WNID index, as the folder's; LOC_synset_mapping.txt (`<wnid> <words>` per line) only
checks that the classes are ImageNet's. Torch-free.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpctrain.data.folder import IMAGE_EXTS, DataError, list_split
from hpctrain.data.prep.ilsvrc import count_note
from hpctrain.data.prep.imagenet import read_val_map
from hpctrain.data.prep.source import MovedFileEntry, Source, SplitEntries, files

KAGGLE = "kaggle"  # `data pack --from kaggle`
CLS_LOC = "ILSVRC/Data/CLS-LOC"  # holds train/<wnid>/ and the flat val/
VAL_SOLUTION = "LOC_val_solution.csv"
SYNSETS = "LOC_synset_mapping.txt"


def kaggle_paths(folder: str | os.PathLike) -> tuple[Path, Path, Path]:
    """(CLS-LOC folder, val solution, synset mapping) of DIR, or one line naming what is missing."""
    folder = Path(folder).resolve()
    cls_loc = folder / CLS_LOC
    want = {f"{CLS_LOC}/train/": cls_loc / "train", f"{CLS_LOC}/val/": cls_loc / "val"}
    missing = [name for name, p in want.items() if not p.is_dir()]
    missing += [name for name in (VAL_SOLUTION, SYNSETS) if not (folder / name).is_file()]
    if missing:
        raise DataError(
            f"{folder} lacks {', '.join(missing)}: --from kaggle reads Kaggle's "
            f"imagenet-object-localization-challenge as downloaded: DIR/{CLS_LOC}/{{train,val}}/, "
            f"DIR/{VAL_SOLUTION} and DIR/{SYNSETS}"
        )
    return cls_loc, folder / VAL_SOLUTION, folder / SYNSETS


def read_synsets(path: Path) -> list[str]:
    """The WNIDs of LOC_synset_mapping.txt, in its order."""
    return [line.split()[0] for line in path.read_text().splitlines() if line.strip()]


def val_entries(val: Path, truth: dict[str, str], classes: tuple[str, ...], exclude: set[str]) -> list[MovedFileEntry]:
    """The flat val files as entries (`<wnid>/<file>` found at `<file>`), in the sorted folder's order."""
    index = {c: i for i, c in enumerate(classes)}
    out = []
    for name in sorted(os.listdir(val)):
        if not name.lower().endswith(IMAGE_EXTS):
            continue
        wnid = truth.get(Path(name).stem)
        if wnid is None:
            raise DataError(f"{val / name} is not in {VAL_SOLUTION}: is it the solution of this val set?")
        if wnid not in index:
            raise DataError(f"{VAL_SOLUTION} puts {name} in {wnid}, which train/ lacks: the splits must share classes")
        rel = f"{wnid}/{name}"
        if rel not in exclude and f"val/{rel}" not in exclude:
            out.append(MovedFileEntry(rel, index[wnid], name))
    return sorted(out, key=lambda e: (e.label, e.file))  # the folder's order: class, then file name


def kaggle_source(folder: str | os.PathLike, exclude: set[str], log=print) -> Source:
    """Train listed as a folder, val from the flat folder and the solution file; nothing moved."""
    cls_loc, solution, synsets = kaggle_paths(folder)
    train = list_split(cls_loc, "train", exclude)
    unknown = sorted(set(train.classes) - set(read_synsets(synsets)))
    if unknown:
        raise DataError(f"{cls_loc / 'train'} has classes {SYNSETS} lacks ({', '.join(unknown[:5])}): {synsets}")
    val = val_entries(cls_loc / "val", read_val_map(solution), train.classes, exclude)
    splits = {"train": SplitEntries(str(train.root), train.classes, files(train.samples))}
    if val:
        splits["val"] = SplitEntries(str(cls_loc / "val"), train.classes, tuple(val))
    root = Path(folder).resolve()
    log(f"{len(train.classes)} classes, {len(train):,} train and {len(val):,} val images in {root}")
    note = count_note(len(train.classes), len(train), len(val))
    if note:
        log(note)
    return Source(str(root), KAGGLE, splits)

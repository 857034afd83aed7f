"""ImageNet preparation: sort the flat val folder, check the layout, find files that do not decode.

DALI has no "skip bad sample" option and a corrupt file stops a run wherever it sits, so bad
files are found once, ahead of time, and written to an exclusion list that every loader (and
`data pack`) honours via `data.exclude_file`. Torch-free (PIL only).
"""

from __future__ import annotations

import csv
import io
import os
import shutil
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.data.folder import IMAGE_EXTS, DataError
from hpctrain.data.meter import Meter

IMAGENET = {"classes": 1000, "train": 1_281_167, "val": 50_000}


@dataclass
class Report:
    classes: dict[str, int] = field(default_factory=dict)  # split → class count
    images: dict[str, int] = field(default_factory=dict)  # split → image count
    problems: list[str] = field(default_factory=list)  # layout problems (one line each)
    notes: list[str] = field(default_factory=list)  # differences from ImageNet-1k
    bad: list[tuple[str, str]] = field(default_factory=list)  # (split/relpath, reason)
    moved: int = 0


def read_val_map(path: str | os.PathLike) -> dict[str, str]:
    """Ground truth as {file name: class}: `LOC_val_solution.csv` or lines of `file class`."""
    p = Path(path)
    if not p.is_file():
        raise DataError(
            f"--val-map {p} does not exist; give LOC_val_solution.csv (Kaggle) or a "
            "text file of `<file name> <class folder>` lines"
        )
    out: dict[str, str] = {}
    text = p.read_text()
    if text.startswith("ImageId,"):  # Kaggle: ImageId,PredictionString("n01751748 x y x y …")
        for row in csv.DictReader(text.splitlines()):
            out[row["ImageId"]] = row["PredictionString"].split()[0]
        return out
    for n, line in enumerate(text.splitlines(), 1):
        parts = line.replace(",", " ").split()
        if not parts or parts[0].startswith("#"):
            continue
        if len(parts) != 2:
            raise DataError(
                f"{p}:{n}: expected `<file name> <class folder>`, got {line!r} (the devkit's "
                "bare index list needs its synset table: convert it to file/class pairs)"
            )
        out[Path(parts[0]).stem] = parts[1]
    return out


def sort_val(val: Path, mapping: dict[str, str], classes: set[str]) -> int:
    """Move flat val/<file> into val/<class>/<file>; returns the number moved."""
    moved = 0
    for f in sorted(p for p in val.iterdir() if p.is_file()):
        if not f.name.lower().endswith(IMAGE_EXTS):
            continue
        cls = mapping.get(f.stem) or mapping.get(f.name)
        if cls is None:
            raise DataError(f"{f} is not in the --val-map file: is it the map for this val set?")
        if classes and cls not in classes:
            raise DataError(f"--val-map puts {f.name} in class {cls!r}, which train/ lacks")
        (val / cls).mkdir(exist_ok=True)
        shutil.move(str(f), str(val / cls / f.name))
        moved += 1
    return moved


def check_image(path: str) -> str | None:
    """None when the file decodes completely, else the reason."""
    try:
        if os.path.getsize(path) == 0:
            return "empty file"
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    return _decodes(path)


def check_bytes(data: bytes) -> str | None:
    """check_image of an image held in memory (an archive member)."""
    return "empty file" if not data else _decodes(io.BytesIO(data))


def _decodes(src) -> str | None:
    from PIL import Image  # PIL: only the converter (`hpctrain data` imports this module on the login node)

    try:
        with Image.open(src) as img:
            img.load()
            if img.width < 1 or img.height < 1:
                return "zero-size image"
    except Exception as e:  # noqa: BLE001 - any failure to decode marks the file
        return f"{type(e).__name__}: {e}"
    return None


def scan_images(
    paths: list, workers: int, what: str = "decoding", log=print, check: Callable = check_image
) -> list[str | None]:
    """check_image of every path (or `check` of every item), in the order given, by `workers`
    processes, with a progress line."""
    meter = Meter(what, len(paths), "images", log=log)
    if workers > 1:
        chunk = max(1, min(256, len(paths) // (4 * workers)))  # small sets still spread over the workers
        with ProcessPoolExecutor(workers) as ex:
            reasons = []
            for r in ex.map(check, paths, chunksize=chunk):  # map keeps the input order
                reasons.append(r)
                meter.add()
    else:
        reasons = []
        for p in paths:
            reasons.append(check(p))
            meter.add()
    meter.finish(
        f"{meter.line()} in {meter.seconds:.1f} s ({workers} worker(s)): "
        f"{sum(r is not None for r in reasons)} do not decode"
    )
    return reasons


def _files(split_dir: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(split_dir):
        dirnames.sort()
        out += [Path(dirpath, f) for f in sorted(filenames) if f.lower().endswith(IMAGE_EXTS)]
    return out


def prepare(
    root: str | os.PathLike, val_map: str | None = None, workers: int = 0, scan: bool = True, log=print
) -> Report:
    """Sort val (with a map), check both splits, scan every image; returns the Report."""
    root = Path(root)
    rep = Report()
    train = root / "train"
    if not train.is_dir():
        raise DataError(f"{train} is not a folder: ROOT must hold train/<class>/<images> and val/")
    train_classes = sorted(d.name for d in train.iterdir() if d.is_dir())
    val = root / "val"
    if val_map:
        if not val.is_dir():
            raise DataError(f"--val-map given but {val} does not exist")
        rep.moved = sort_val(val, read_val_map(val_map), set(train_classes))
        log(f"sorted {rep.moved} val images into class folders")
    for split in ("train", "val"):
        base = root / split
        if not base.is_dir():
            rep.problems.append(f"{base} is missing")
            continue
        classes = sorted(d.name for d in base.iterdir() if d.is_dir())
        loose = [p.name for p in base.iterdir() if p.is_file() and p.name.lower().endswith(IMAGE_EXTS)]
        if loose:
            rep.problems.append(
                f"{base} has {len(loose)} images outside class folders (e.g. {loose[0]}); sort them with --val-map FILE"
            )
        files = _files(base)
        counts: dict[str, int] = {c: 0 for c in classes}
        for f in files:
            rel = f.relative_to(base).parts
            if len(rel) > 1:
                counts[rel[0]] += 1
        rep.classes[split], rep.images[split] = len(classes), sum(counts.values())
        empty = [c for c, n in counts.items() if n == 0]
        if empty:
            rep.problems.append(f"{split}: {len(empty)} empty class folders: {', '.join(empty[:5])}")
        if split == "val":
            unknown = sorted(set(classes) - set(train_classes))
            if unknown:
                rep.problems.append(f"val: {len(unknown)} classes that train/ lacks: {', '.join(unknown[:5])}")
        if rep.images[split] != IMAGENET[split]:
            rep.notes.append(f"{split}: {rep.images[split]:,} images, ImageNet-1k has {IMAGENET[split]:,}")
        if len(classes) != IMAGENET["classes"]:
            rep.notes.append(f"{split}: {len(classes)} classes, ImageNet-1k has {IMAGENET['classes']}")
        if scan and files:
            reasons = scan_images([str(f) for f in files], workers, f"decoding {split}", log)
            rep.bad += [
                (f"{split}/{f.relative_to(base).as_posix()}", r) for f, r in zip(files, reasons) if r is not None
            ]
    return rep


def write_exclusions(path: str | os.PathLike, bad: list[tuple[str, str]], root: Path) -> None:
    lines = [f"# files under {root.resolve()} that do not decode (hpctrain data prepare-imagenet)"]
    lines += [f"{rel}  # {reason.splitlines()[0][:120]}" for rel, reason in bad]
    Path(path).write_text("\n".join(lines) + "\n")

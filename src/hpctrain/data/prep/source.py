"""Where `data pack` reads a sample's bytes: a file under a split folder, or a span of an archive.

A pack plans from entries and packs by reading them; the entries are all the plan needs to know
of the source, so an ImageNet folder and the official ILSVRC2012 tars (data/prep/ilsvrc.py) go
through the same plan, groups, markers and Slurm array. An entry is `(relative path, label)` in a
folder (the path under the split folder), or `(relative path, label, offset, size)` in an archive:
the member's bytes lie at `offset` of the archive file, so a shard reads them by one seek and one
read and nothing is ever extracted. The relative path of an archive member is the one it would
have in the extracted folder (`<wnid>/<file>`), so exclusion lists and error messages name the
same images either way. Two more forms keep that folder path while the bytes lie elsewhere:
`(relative path, label, file)`, a file under the split root at another path (Kaggle's flat val
folder, data/prep/kaggle.py), and `(relative path, label, parquet file, row group, row)`, an image
cell of a parquet file under the root (Hugging Face's imagenet-1k, data/prep/hf_parquet.py).
Torch-free; pyarrow only for a parquet entry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from hpctrain.data.folder import DataError, list_split
from hpctrain.data.prep import parquet
from hpctrain.data.prep.imagenet import check_bytes, check_image
from hpctrain.data.wds import SPLITS

FOLDER = "folder"  # `data pack --from folder` (the default): ROOT/{train,val}/<class>/<image>

# (relative path, label[, offset, size | , file | , parquet file, row group, row]); a plan's sample
# puts the key first
Entry = tuple


@dataclass(frozen=True)
class SplitEntries:
    root: str  # the split folder the relative paths are under, or the archive file holding the members
    classes: tuple[str, ...]  # label i is classes[i]
    entries: tuple[Entry, ...]  # in the order the keys are given (sorted class, then name)

    def __len__(self) -> int:
        return len(self.entries)


@dataclass(frozen=True)
class Source:
    root: str  # what the user gave: the dataset folder, or the folder of the official archives
    kind: str  # FOLDER or ilsvrc.ILSVRC2012
    splits: dict[str, SplitEntries]  # train, and val when there is one


def folder_source(root: str | os.PathLike, exclude: set[str], log=print) -> Source:
    """An ImageNet-layout folder, listed as every loader lists it (data/folder.py)."""
    root = Path(root).resolve()  # array tasks may start elsewhere
    train = list_split(root, "train", exclude)
    splits = {"train": SplitEntries(str(train.root), train.classes, train.samples)}
    if (root / "val").is_dir():
        val = list_split(root, "val", exclude, classes=train.classes)
        splits["val"] = SplitEntries(str(val.root), val.classes, val.samples)
    return Source(str(root), FOLDER, {s: splits[s] for s in SPLITS if s in splits})


def in_archive(sample: tuple) -> bool:
    """A plan's sample (key, *entry) read from an archive rather than a file."""
    return len(sample) == 5


def in_parquet(sample: tuple) -> bool:
    """A plan's sample (key, *entry) read from a parquet file's image cell."""
    return len(sample) == 6


def file_of(root: str, sample: tuple) -> Path:
    """The file holding a sample that is not in an archive or a parquet file: at its folder path,
    or at the path its entry gives (a flat val folder's file)."""
    return Path(root) / (sample[3] if len(sample) == 4 else sample[1])


def display(root: str, sample: tuple) -> str:
    """The sample's place, for a message: its file, the archive and the member's folder path, or
    the parquet file, its row group and row."""
    if in_archive(sample):
        return f"{root} ({sample[1]})"
    if in_parquet(sample):
        return f"{Path(root) / sample[3]} (row group {sample[4]}, row {sample[5]}: {sample[1]})"
    return str(file_of(root, sample))


Spec = str | tuple[str, int, int] | tuple[str, int, int, None]


def check_spec(root: str, sample: tuple) -> Spec:
    """What a decode-check worker needs to read the sample itself (small to send to a process):
    a file, (archive, offset, size), or (parquet file, row group, row, None)."""
    if in_archive(sample):
        return (root, int(sample[3]), int(sample[4]))
    if in_parquet(sample):
        return (str(Path(root) / sample[3]), int(sample[4]), int(sample[5]), None)
    return str(file_of(root, sample))


_FDS: dict[str, int] = {}  # archive → a descriptor kept open by this process (read by pread only)


def check_sample(spec: Spec) -> str | None:
    """imagenet.check_image of a check_spec: None when it decodes, else the reason. An archive is
    opened once per process, not once per image (1.3 M opens of one file on a parallel file
    system); `os.pread` leaves the descriptor's offset alone, so forked workers that inherit it
    cannot move each other's reads."""
    if isinstance(spec, str):
        return check_image(spec)
    if len(spec) == 4:
        return check_bytes(parquet.cell(spec[0], spec[1], spec[2]))
    path, offset, size = spec[:3]
    if path not in _FDS:
        _FDS[path] = os.open(path, os.O_RDONLY)
    data = os.pread(_FDS[path], size, offset)
    while len(data) < size:  # a short read happens only at the end of the file (or a signal)
        more = os.pread(_FDS[path], size - len(data), offset + len(data))
        if not more:
            return f"{path} ends at byte {offset + len(data)}, inside a member of {size} bytes: is it cut short?"
        data += more
    return check_bytes(data)


def read_span(f: BinaryIO, offset: int, size: int, name: str) -> bytes:
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise DataError(f"{name} ends at byte {offset + len(data)}, inside a member of {size} bytes: is it cut short?")
    return data


class SampleReader:
    """Reads one shard's samples from one split root, opening an archive once per shard; a
    shard's parquet cells are read up front, each row group once (parquet.cells)."""

    def __init__(self, root: str, samples: tuple[tuple, ...] = ()):
        self.root = root
        self._f: BinaryIO | None = None
        wanted = [(str(Path(root) / s[3]), int(s[4]), int(s[5])) for s in samples if in_parquet(s)]
        self._cells = parquet.cells(wanted) if wanted else {}

    def __enter__(self) -> SampleReader:
        return self

    def __exit__(self, *exc) -> None:
        if self._f is not None:
            self._f.close()

    def read(self, sample: tuple) -> bytes:
        if in_parquet(sample):
            return self._cells[(str(Path(self.root) / sample[3]), int(sample[4]), int(sample[5]))]
        if not in_archive(sample):
            return file_of(self.root, sample).read_bytes()
        if self._f is None:
            self._f = open(self.root, "rb")  # noqa: SIM115 - closed by __exit__, kept for the shard
        return read_span(self._f, int(sample[3]), int(sample[4]), self.root)

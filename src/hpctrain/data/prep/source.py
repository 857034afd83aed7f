"""Where `data pack` reads a sample's bytes: a file under a split folder, or a span of an archive.

A pack plans from entries and packs by reading them; the entries are all the plan needs to know
of the source, so an ImageNet folder and the official ILSVRC2012 tars (data/prep/ilsvrc.py) go
through the same plan, groups, markers and Slurm array. An entry is a `FileEntry` in a folder
(its path under the split folder), or an `ArchiveEntry` in an archive: the member's bytes lie at
`offset` of the archive file, so a shard reads them by one seek and one read and nothing is ever
extracted. The relative path of an archive member is the one it would have in the extracted
folder (`<wnid>/<file>`), so exclusion lists and error messages name the same images either way.
Two more kinds keep that folder path while the bytes lie elsewhere: a `MovedFileEntry`, a file
under the split root at another path (Kaggle's flat val folder, data/prep/kaggle.py), and a
`ParquetEntry`, an image cell of a parquet file under the root (Hugging Face's imagenet-1k,
data/prep/hf_parquet.py). Each kind is its own class, told apart by type; only the plan file
(`Sample.row`/`Sample.of_row`) stores them as lists, whose length names the kind.
Torch-free; pyarrow only for a parquet entry.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, fields
from operator import attrgetter
from pathlib import Path
from typing import BinaryIO

from hpctrain.data.folder import DataError, list_split
from hpctrain.data.prep import parquet
from hpctrain.data.prep.imagenet import check_bytes, check_image
from hpctrain.data.wds import SPLITS

FOLDER = "folder"  # `data pack --from folder` (the default): ROOT/{train,val}/<class>/<image>


@dataclass(frozen=True, slots=True)
class FileEntry:
    """An image file at its folder path (the folder source; Kaggle's train)."""

    path: str  # relative to the split folder: <class>/<file>
    label: int  # index into the split's classes


@dataclass(frozen=True, slots=True)
class ArchiveEntry:
    """A tar member read in place (the official ILSVRC2012 files)."""

    path: str  # the folder path it would have once extracted: <wnid>/<file>
    label: int  # index into the split's classes
    offset: int  # where the member's bytes start in the archive file (the split root)
    size: int  # the member's size in bytes


@dataclass(frozen=True, slots=True)
class MovedFileEntry:
    """A file under the split root at another path than its folder path (Kaggle's flat val)."""

    path: str  # the folder path it would have: <wnid>/<file>
    label: int  # index into the split's classes
    file: str  # where it is, relative to the split root


@dataclass(frozen=True, slots=True)
class ParquetEntry:
    """An image cell of a parquet file under the split root (Hugging Face's imagenet-1k)."""

    path: str  # the folder path it would have: <class>/<file>
    label: int  # index into the split's classes
    file: str  # the parquet file, relative to the split root
    row_group: int  # its row group
    row: int  # the row within that row group


Entry = FileEntry | ArchiveEntry | MovedFileEntry | ParquetEntry
_KINDS: tuple[type[Entry], ...] = (FileEntry, ArchiveEntry, MovedFileEntry, ParquetEntry)
# the plan file's list form of an entry: its fields in order, the kind told by their count
_BY_FIELDS: dict[int, type[Entry]] = {len(fields(k)): k for k in _KINDS}
_VALUES = {k: attrgetter(*(f.name for f in fields(k))) for k in _KINDS}  # an entry's fields in order, as a tuple


@dataclass(frozen=True, slots=True)
class Sample:
    """An entry of a plan's shard: `key` is its place in the split's listing (its name in the tar)."""

    key: int  # the sample's place in the split's listing, without the excluded images
    entry: Entry  # where its bytes lie

    def row(self) -> list:
        """plan.json's form: [key, *the entry's fields] (the format written since format 1)."""
        return [self.key, *_VALUES[type(self.entry)](self.entry)]

    @classmethod
    def of_row(cls, row: list) -> Sample:
        """A `row()` read back from plan.json."""
        kind = _BY_FIELDS.get(len(row) - 1)
        if kind is None:
            raise DataError(f"a plan sample has {len(row)} fields ({row!r:.80}): remove OUT/.pack and pack again")
        return cls(int(row[0]), kind(*row[1:]))


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
    splits = {"train": SplitEntries(str(train.root), train.classes, files(train.samples))}
    if (root / "val").is_dir():
        val = list_split(root, "val", exclude, classes=train.classes)
        splits["val"] = SplitEntries(str(val.root), val.classes, files(val.samples))
    return Source(str(root), FOLDER, {s: splits[s] for s in SPLITS if s in splits})


def files(samples: tuple[tuple[str, int], ...]) -> tuple[FileEntry, ...]:
    """A folder listing's (relative path, label) pairs (data/folder.py) as entries."""
    return tuple(FileEntry(rel, label) for rel, label in samples)


def file_of(root: str, entry: FileEntry | MovedFileEntry) -> Path:
    """The file holding an entry that is not in an archive or a parquet file: at its folder path,
    or at the path its entry gives (a flat val folder's file)."""
    return Path(root) / (entry.file if isinstance(entry, MovedFileEntry) else entry.path)


def display(root: str, entry: Entry) -> str:
    """The entry's place, for a message: its file, the archive and the member's folder path, or
    the parquet file, its row group and row."""
    if isinstance(entry, ArchiveEntry):
        return f"{root} ({entry.path})"
    if isinstance(entry, ParquetEntry):
        return f"{Path(root) / entry.file} (row group {entry.row_group}, row {entry.row}: {entry.path})"
    return str(file_of(root, entry))


@dataclass(frozen=True, order=True, slots=True)
class ArchiveSpan:
    """A decode-check's archive member: `size` bytes at `offset` of `path`."""

    path: str  # the archive file
    offset: int  # where the member's bytes start
    size: int  # how many


@dataclass(frozen=True, order=True, slots=True)
class ParquetCell:
    """A decode-check's parquet image cell."""

    path: str  # the parquet file
    row_group: int  # its row group
    row: int  # the row within it


Spec = str | ArchiveSpan | ParquetCell  # a file's path, or where the bytes lie: ordered, small to send to a process


def check_spec(root: str, entry: Entry) -> Spec:
    """What a decode-check worker needs to read the entry itself (small to send to a process)."""
    if isinstance(entry, ArchiveEntry):
        return ArchiveSpan(root, entry.offset, entry.size)
    if isinstance(entry, ParquetEntry):
        return ParquetCell(str(Path(root) / entry.file), entry.row_group, entry.row)
    return str(file_of(root, entry))


_FDS: dict[str, int] = {}  # archive → a descriptor kept open by this process (read by pread only)


def check_sample(spec: Spec) -> str | None:
    """imagenet.check_image of a check_spec: None when it decodes, else the reason. An archive is
    opened once per process, not once per image (1.3 M opens of one file on a parallel file
    system); `os.pread` leaves the descriptor's offset alone, so forked workers that inherit it
    cannot move each other's reads."""
    if isinstance(spec, str):
        return check_image(spec)
    if isinstance(spec, ParquetCell):
        return check_bytes(parquet.cell(spec.path, spec.row_group, spec.row))
    path, offset, size = spec.path, spec.offset, spec.size
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

    def __init__(self, root: str, entries: Iterable[Entry] = ()):
        self.root = root
        self._f: BinaryIO | None = None
        wanted = [(str(Path(root) / e.file), e.row_group, e.row) for e in entries if isinstance(e, ParquetEntry)]
        self._cells = parquet.cells(wanted) if wanted else {}

    def __enter__(self) -> SampleReader:
        return self

    def __exit__(self, *exc) -> None:
        if self._f is not None:
            self._f.close()

    def read(self, entry: Entry) -> bytes:
        if isinstance(entry, ParquetEntry):
            return self._cells[(str(Path(self.root) / entry.file), entry.row_group, entry.row)]
        if not isinstance(entry, ArchiveEntry):
            return file_of(self.root, entry).read_bytes()
        if self._f is None:
            self._f = open(self.root, "rb")  # noqa: SIM115 - closed by __exit__, kept for the shard
        return read_span(self._f, entry.offset, entry.size, self.root)

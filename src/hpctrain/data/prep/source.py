"""Where `data pack` reads a sample's bytes: a file under a split folder, or a span of an archive.

A pack plans from entries and packs by reading them; the entries are all the plan needs to know
of the source, so an ImageNet folder and the official ILSVRC2012 tars (data/prep/ilsvrc.py) go
through the same plan, groups, markers and Slurm array. An entry is `(relative path, label)` in a
folder (the path under the split folder), or `(relative path, label, offset, size)` in an archive:
the member's bytes lie at `offset` of the archive file, so a shard reads them by one seek and one
read and nothing is ever extracted. The relative path of an archive member is the one it would
have in the extracted folder (`<wnid>/<file>`), so exclusion lists and error messages name the
same images either way. Torch-free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from hpctrain.data.folder import DataError, list_split
from hpctrain.data.prep.imagenet import check_bytes, check_image
from hpctrain.data.wds import SPLITS

FOLDER = "folder"  # `data pack --from folder` (the default): ROOT/{train,val}/<class>/<image>

# (relative path, label) or (relative path, label, offset, size); a plan's sample puts the key first
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


def display(root: str, sample: tuple) -> str:
    """The sample's place, for a message: its file, or the archive and the member's folder path."""
    return f"{root} ({sample[1]})" if in_archive(sample) else str(Path(root) / sample[1])


def check_spec(root: str, sample: tuple) -> str | tuple[str, int, int]:
    """What a decode-check worker needs to read the sample itself (small to send to a process)."""
    return (root, int(sample[3]), int(sample[4])) if in_archive(sample) else str(Path(root) / sample[1])


_FDS: dict[str, int] = {}  # archive → a descriptor kept open by this process (read by pread only)


def check_sample(spec: str | tuple[str, int, int]) -> str | None:
    """imagenet.check_image of a check_spec: None when it decodes, else the reason. An archive is
    opened once per process, not once per image (1.3 M opens of one file on a parallel file
    system); `os.pread` leaves the descriptor's offset alone, so forked workers that inherit it
    cannot move each other's reads."""
    if isinstance(spec, str):
        return check_image(spec)
    path, offset, size = spec
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
    """Reads one shard's samples from one split root, opening an archive once per shard."""

    def __init__(self, root: str):
        self.root = root
        self._f: BinaryIO | None = None

    def __enter__(self) -> SampleReader:
        return self

    def __exit__(self, *exc) -> None:
        if self._f is not None:
            self._f.close()

    def read(self, sample: tuple) -> bytes:
        if not in_archive(sample):
            return (Path(self.root) / sample[1]).read_bytes()
        if self._f is None:
            self._f = open(self.root, "rb")  # noqa: SIM115 - closed by __exit__, kept for the shard
        return read_span(self._f, int(sample[3]), int(sample[4]), self.root)

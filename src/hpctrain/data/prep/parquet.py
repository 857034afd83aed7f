"""Image cells of parquet files read by (file, row group, row), for `data pack --from hf-parquet`.

A row group is parquet's smallest unit of reading: one row's image cannot be read without its
row group's column chunk, so a shard's worker groups its rows by row group and reads each once
(`cells`), keeping only the images it needs. pyarrow is imported here, inside the functions, and
only the packing processes call them: it is the `data` extra's heavy optional package and never
on the login node's import path.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from hpctrain.data.folder import DataError

IMAGE = "image"  # a struct {bytes: binary, path: string} (Hugging Face's Image feature)
LABEL = "label"  # int64 class index

Cell = tuple[str, int, int]  # (parquet file, row group, row within the row group)


def pq() -> Any:
    """pyarrow.parquet, or one line naming the extra that brings it."""
    try:
        # pyarrow: a heavy optional package (the `data` extra); imported only when parquet is read
        import pyarrow.parquet
    except ImportError:
        raise DataError(
            "reading parquet files needs pyarrow, which this install lacks: pip install 'hpctrain[data]'"
        ) from None
    return pyarrow.parquet


def _images(path: str, group: int) -> Any:
    """One row group's image column (a struct array)."""
    return pq().ParquetFile(path).read_row_group(group, columns=[IMAGE]).column(IMAGE).combine_chunks()


def _bytes(images: Any, row: int, where: str) -> bytes:
    data = images.field("bytes")[row].as_py()
    if data is None:
        raise DataError(f"{where}: the image cell holds no bytes (an image stored by path only cannot be packed)")
    return data


def cells(wanted: list[Cell]) -> dict[Cell, bytes]:
    """The image bytes of every wanted cell, each row group read once."""
    by_group: dict[tuple[str, int], list[int]] = defaultdict(list)
    for path, group, row in wanted:
        by_group[(path, group)].append(row)
    out: dict[Cell, bytes] = {}
    for (path, group), rows in sorted(by_group.items()):
        images = _images(path, group)
        for row in rows:
            out[(path, group, row)] = _bytes(images, row, f"{path} row group {group} row {row}")
    return out


_LAST: dict[tuple[str, int], Any] = {}  # this process's last row group read by `cell`


def cell(path: str, group: int, row: int) -> bytes:
    """One image (the decode check's unit), keeping the last row group read: pack.bad_images hands
    the checks out in sorted order, so a worker's run of rows of one row group costs one read."""
    key = (path, group)
    if key not in _LAST:
        _LAST.clear()
        _LAST[key] = _images(path, group)
    return _bytes(_LAST[key], row, f"{path} row group {group} row {row}")

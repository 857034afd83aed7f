"""WebDataset shards written by `hpctrain data pack`: the layout, and finding a split's shards.

Millions of small files are slow on Lustre/GPFS; a few hundred tar shards read sequentially are
fast. Each sample is `<key>.<jpg|png|…>` (the original bytes), `<key>.cls` (label as text, for
other WebDataset tools) and `<key>.lbl` (label as int64, what DALI reads: a text .cls arrives
in DALI as raw bytes). Next to every tar goes its DALI index (`wds2idx` format v1.2).
`meta.json`, the shard index, lists classes, shards and sample counts; it is written last, so a
folder without it is not a finished pack. Packing is `data/prep/pack.py`, node-local copies
`data/stage.py`. Torch-free.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from hpctrain.data.folder import DataError

META = "meta.json"
SPLITS = ("train", "val")


@dataclass(frozen=True)
class WdsShards:
    """A split of `data pack` output: tar shards, their DALI index files and the sample count."""

    tars: tuple[str, ...]
    indices: tuple[str, ...]
    size: int
    classes: tuple[str, ...]


def read_meta(root: str | os.PathLike) -> dict:
    mp = Path(root) / META
    if not mp.is_file():
        raise DataError(
            f"{mp} is missing: data.format=wds needs the output of `hpctrain data pack ROOT OUT` as data.root"
        )
    return json.loads(mp.read_text())


def shard_files(meta: dict) -> list[str]:
    """Every tar and index file the shard index lists, split by split, in shard order."""
    return [s[k] for split in SPLITS if split in meta for s in meta[split]["shards"] for k in ("tar", "idx")]


def find_shards(root: str | os.PathLike, split: str) -> WdsShards:
    """The WdsShards of one split; FileNotFoundError when the split was not packed."""
    root = Path(root)
    meta = read_meta(root)
    if split not in meta:
        raise FileNotFoundError(f"{root} has no {split} shards")
    sh = meta[split]["shards"]
    for s in sh:
        for k in ("tar", "idx"):
            if not (root / s[k]).is_file():
                raise DataError(f"{root / s[k]} is missing: re-run `hpctrain data pack`")
    return WdsShards(
        tuple(str(root / s["tar"]) for s in sh),
        tuple(str(root / s["idx"]) for s in sh),
        int(meta[split]["size"]),
        tuple(meta["classes"]),
    )

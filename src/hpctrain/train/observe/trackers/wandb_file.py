"""Reads W&B's offline transaction log (`offline-run-*/run-<id>.wandb`) without a server.

wandb ≥ 0.2x no longer ships a Python reader (`wandb.sdk.internal.datastore` is gone in 0.31), so
this is the framing of wandb-core's writer: a 7-byte file header (`:W&B`, magic 0xBEE1 little-endian,
version 0) and then LevelDB's log format — 32 KiB blocks of chunks, each `crc32c(4) length(2, LE)
type(1)` + payload, type 1 full / 2 first / 3 middle / 4 last, a block's tail under 7 bytes is zero
padding. The payloads are `wandb.proto.wandb_internal_pb2.Record` messages (sources in
docs/trackers.md). Only what resuming needs: the steps of the history records.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK = 32768
CHUNK_HEAD = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def payloads(path: Path) -> Iterator[bytes]:
    """Each record's bytes, in order; a cut tail (a crash mid-write) ends the iteration."""
    data = Path(path).read_bytes()
    if not data.startswith(HEADER):
        raise ValueError(f"{path} is not a W&B transaction log (no :W&B header)")
    pos, parts = len(HEADER), []
    while pos + CHUNK_HEAD <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK_HEAD:
            pos += left  # block padding
            continue
        length, kind = struct.unpack_from("<HB", data, pos + 4)
        if kind == 0 and length == 0:  # zero fill (preallocated or padding)
            pos += left
            continue
        body = data[pos + CHUNK_HEAD : pos + CHUNK_HEAD + length]
        if len(body) < length:
            return
        pos += CHUNK_HEAD + length
        if kind == FULL:
            yield body
        elif kind == FIRST:
            parts = [body]
        elif kind == MIDDLE:
            parts.append(body)
        elif kind == LAST:
            yield b"".join([*parts, body])
            parts = []


def records(path: Path) -> Iterator:
    """Parsed `Record` protos (needs the wandb package: its generated protobuf classes)."""
    from wandb.proto import wandb_internal_pb2  # heavy optional package (the trackers extra)

    for raw in payloads(path):
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(raw)
        yield rec

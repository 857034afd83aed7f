"""Read a SIF file's header, descriptors, embedded definition and labels, without apptainer.

Layout (sylabs/sif spec 01, little-endian, packed): a 128-byte global header — 32-byte launch
script, "SIF_MAGIC\\0", version "01\\0", architecture "NN\\0", 16-byte UUID, then eight int64s
(created, modified, descriptors free, descriptors total, descriptors offset, descriptors size,
data offset, data size) — followed by `total` 585-byte descriptors at `descriptors offset`.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from hpctrain.images import ImageError

MAGIC = b"SIF_MAGIC\0"
HEADER = struct.Struct("<32s10s3s3s16s8q")
DESCRIPTOR = struct.Struct("<iBIIIqqqqqqq128s384s")
GROUP_MASK = 0xF0000000
DATA_TYPES = {
    0x4001: "Def.FILE",
    0x4002: "Env.Vars",
    0x4003: "JSON.Labels",
    0x4004: "FS",
    0x4005: "Signature",
    0x4006: "JSON.Generic",
    0x4007: "Generic",
    0x4008: "Cryptographic Message",
    0x4009: "SBOM",
}
ARCHES = {
    "01": "386",
    "02": "amd64",
    "03": "arm",
    "04": "arm64",
    "05": "ppc64",
    "06": "ppc64le",
    "07": "mips",
    "08": "mipsle",
    "09": "mips64",
    "10": "mips64le",
    "11": "s390x",
    "12": "riscv64",
}
FS_TYPES = {1: "Squashfs", 2: "Ext3", 3: "ImmuObj", 4: "Raw"}
PART_TYPES = {1: "System", 2: "PrimSys", 3: "Data", 4: "Overlay"}


@dataclass(frozen=True)
class Descriptor:
    id: int
    type: str
    group: int  # 0: none
    link: int
    offset: int
    size: int
    name: str
    extra: str  # partition: "Squashfs/PrimSys/amd64"


@dataclass(frozen=True)
class SifInfo:
    path: str
    version: str
    arch: str
    uuid: str
    created: str
    modified: str
    descriptors: list[Descriptor]
    definition: str | None = None
    labels: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def _cstr(b: bytes) -> str:
    return b.split(b"\0", 1)[0].decode("utf-8", "replace")


def _time(t: int) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def read_sif(path: str | Path) -> SifInfo:
    """Parse `path`; a short, foreign or truncated file raises ImageError saying which."""
    path = Path(path)
    try:
        f = path.open("rb")
    except OSError as e:
        raise ImageError(f"cannot read {path}: {e.strerror}") from None
    with f:
        size = path.stat().st_size
        head = f.read(HEADER.size)
        if len(head) < HEADER.size:
            if MAGIC in head:
                raise ImageError(
                    f"{path} is a truncated SIF file: {size} bytes, the header alone needs "
                    f"{HEADER.size}; copy the image again"
                )
            raise ImageError(f"{path} is not a SIF file ({size} bytes, no SIF header)")
        (
            launch,
            magic,
            version,
            arch,
            uid,
            created,
            modified,
            _free,
            total,
            d_off,
            d_size,
            data_off,
            data_size,
        ) = HEADER.unpack(head)
        if magic != MAGIC:
            raise ImageError(
                f"{path} is not a SIF file (no SIF_MAGIC at byte 32); is it a Docker archive or a sandbox directory?"
            )
        need = max(d_off + d_size, data_off + data_size)
        if size < need:
            raise ImageError(
                f"{path} is a truncated SIF file: the header says it holds {need} bytes but "
                f"the file has {size}; the copy or build was cut short — copy or build it again"
            )
        if total * DESCRIPTOR.size > d_size:
            raise ImageError(f"{path}: corrupt SIF header ({total} descriptors do not fit in {d_size} bytes)")
        f.seek(d_off)
        raw = f.read(total * DESCRIPTOR.size)
        descs: list[Descriptor] = []
        for i in range(total):
            (dtype, used, did, group, link, off, dsize, _padded, _c, _m, _uid, _gid, name, extra) = (
                DESCRIPTOR.unpack_from(raw, i * DESCRIPTOR.size)
            )
            if not used:
                continue
            kind = DATA_TYPES.get(dtype, hex(dtype))
            info = ""
            if dtype == 0x4004:
                fs, part = struct.unpack_from("<ii", extra)
                info = (
                    f"{FS_TYPES.get(fs, fs)}/{PART_TYPES.get(part, part)}/"
                    f"{ARCHES.get(_cstr(extra[8:11]), _cstr(extra[8:11]))}"
                )
            if off + dsize > size:
                raise ImageError(
                    f"{path} is a truncated SIF file: object {did} ({kind}) ends at byte "
                    f"{off + dsize} but the file has {size}; copy or build it again"
                )
            descs.append(Descriptor(did, kind, group & ~GROUP_MASK, link, off, dsize, _cstr(name), info))

        definition, labels = None, {}
        for d in descs:
            f.seek(d.offset)
            if d.type == "Def.FILE":
                definition = f.read(d.size).decode("utf-8", "replace")
            elif d.type in ("JSON.Labels", "JSON.Generic"):
                try:
                    obj = json.loads(f.read(d.size) or b"{}")
                except ValueError:
                    continue
                if d.type == "JSON.Generic" and isinstance(obj, dict):
                    # apptainer/SingularityCE inspect metadata: {"labels": …, "deffile": …}
                    labels.update(obj.get("labels") or {})
                    definition = definition or obj.get("deffile")
                elif isinstance(obj, dict):
                    # older Singularity nests labels by partition: {"system-partition": {…}}
                    obj = obj.get("system-partition", obj) if isinstance(obj.get("system-partition"), dict) else obj
                    labels.update({str(k): str(v) for k, v in obj.items() if not isinstance(v, dict)})
    _ = launch
    rootfs = next((d for d in descs if d.extra.startswith("Squashfs/PrimSys")), None)
    if rootfs is not None and (definition is None or not labels):
        # Apptainer keeps both inside the root filesystem too; read them without mounting it.
        if definition is None:
            definition = _squashfs_file(path, rootfs.offset, ".singularity.d/Singularity")
        if not labels:
            try:
                labels = {
                    str(k): str(v)
                    for k, v in json.loads(
                        _squashfs_file(path, rootfs.offset, ".singularity.d/labels.json") or "{}"
                    ).items()
                }
            except (ValueError, AttributeError):
                labels = {}
    return SifInfo(
        str(path),
        _cstr(version),
        ARCHES.get(_cstr(arch), _cstr(arch)),
        str(uuid.UUID(bytes=uid)),
        _time(created),
        _time(modified),
        descs,
        definition,
        labels,
    )


def _squashfs_file(path: Path, offset: int, name: str) -> str | None:
    """One file out of the squashfs partition at `offset` (needs squashfs-tools' unsquashfs)."""
    if shutil.which("unsquashfs") is None:
        return None
    r = subprocess.run(
        ["unsquashfs", "-o", str(offset), "-cat", str(path), name], capture_output=True, text=True, timeout=60
    )
    return r.stdout if r.returncode == 0 and r.stdout else None


def format_info(info: SifInfo) -> str:
    """A readable summary like `siftool header` + `list`, then labels and the definition."""
    lines = [
        f"{info.path}",
        f"  SIF version {info.version}, {info.arch}, id {info.uuid}",
        f"  created {info.created}, modified {info.modified}",
        "  objects:",
    ]
    for d in info.descriptors:
        group = d.group or "-"
        lines.append(f"    {d.id:>3}  {d.type:<13} group {group:<3} {d.size:>12,} bytes  {d.extra or d.name}")
    lines.append("  labels:" if info.labels else "  labels: none")
    lines += [f"    {k}: {v}" for k, v in sorted(info.labels.items())]
    if info.definition is None:
        lines.append("  definition: none embedded")
    else:
        lines.append("  definition:")
        lines += ["    " + ln for ln in info.definition.rstrip("\n").splitlines()]
    return "\n".join(lines)

"""The three files image-net.org hands out for ILSVRC2012, written from given JPEG bytes: a train tar
of per-class tars, a flat val tar, and the devkit (meta.mat's `synsets`, the val ground truth).

One builder for the miniature `tests/data/prep/test_pack_ilsvrc2012.py` checks the pack against
and the one `bench/pack_ilsvrc2012.py` times, so the benchmark times the layout the test proves.
The layout is docs/data.md's "The official files"."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
from scipy.io import savemat

from hpctrain.data.prep import ilsvrc


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def tar_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in members.items():
            add(t, name, data)
    return buf.getvalue()


def meta_mat(ids: dict[str, int], parents: dict[str, int], per_class: int) -> bytes:
    """The devkit's meta.mat: a `synsets` struct array (scipy.io.savemat writes a numpy record array
    as one), in ID order as the devkit lists it. `ids`: the classes (leaves, WNID → ILSVRC2012_ID);
    `parents`: synsets with children, which are no class."""
    fields = ["ILSVRC2012_ID", "WNID", "words", "gloss", "num_children", "children"]
    fields += ["wordnet_height", "num_train_images"]
    rows = [(i, w, f"class {w}", "a gloss", 0, np.zeros(0), 0, per_class) for w, i in ids.items()]
    children = np.array(sorted(ids.values())[:2])
    rows += [(i, w, "a parent", "a gloss", len(children), children, 1, 0) for w, i in parents.items()]
    rows.sort()
    arr = np.empty((len(rows), 1), dtype=[(f, object) for f in fields])
    for k, row in enumerate(rows):
        arr[k, 0] = row
    buf = io.BytesIO()
    savemat(buf, {"synsets": arr})
    return buf.getvalue()


def write_official(
    d: Path,
    train: dict[str, dict[str, bytes]],
    val: dict[str, tuple[bytes, str]],
    ids: dict[str, int],
    parents: dict[str, int],
) -> None:
    """The three files in `d`. `train`: WNID → {file name: JPEG}, in the outer tar's order; `val`:
    file name → (JPEG, WNID), in the val tar's order; the ground truth lists the IDs in file-name
    order, as the devkit does."""
    with tarfile.open(d / ilsvrc.TRAIN_TAR, "w") as outer:
        for wnid, files in train.items():
            add(outer, f"{wnid}.tar", tar_bytes(files))
    (d / ilsvrc.VAL_TAR).write_bytes(tar_bytes({name: data for name, (data, _) in val.items()}))
    truth = "".join(f"{ids[val[name][1]]}\n" for name in sorted(val)).encode()
    per_class = max((len(f) for f in train.values()), default=0)
    with tarfile.open(d / ilsvrc.DEVKIT, "w:gz") as t:
        add(t, ilsvrc.META_MAT, meta_mat(ids, parents, per_class))
        add(t, ilsvrc.VAL_TRUTH, truth)

"""`image inspect` reads SIF files written by Debian's siftool + mksquashfs, without apptainer."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from hpctrain.images import ImageError
from hpctrain.images.sif import read_sif

DEF = 'Bootstrap: docker\nFrom: nvcr.io/nvidia/pytorch:23.12-py3\n\n%runscript\n    exec hpctrain "$@"\n'
LABELS = {"hpctrain.version": "0.1.0", "org.opencontainers.image.title": "test image"}

pytestmark = pytest.mark.skipif(
    not (shutil.which("siftool") and shutil.which("mksquashfs")),
    reason="needs Debian's siftool and squashfs-tools (installed by .ci/run)",
)


def add_rootfs(run) -> None:
    """Add root.sqfs as the image's system partition (squashfs, amd64), as apptainer build does."""
    run(
        "siftool",
        "add",
        "image.sif",
        "root.sqfs",
        "--datatype",
        "4",
        "--parttype",
        "2",
        "--partfs",
        "1",
        "--partarch",
        "2",
        "--groupid",
        "1",
    )


@pytest.fixture(scope="module")
def sif(tmp_path_factory):
    d = tmp_path_factory.mktemp("sif")
    (d / "root/.singularity.d").mkdir(parents=True)
    (d / "root/.singularity.d/runscript").write_text('#!/bin/sh\nexec hpctrain "$@"\n')
    (d / "image.def").write_text(DEF)
    (d / "labels.json").write_text(json.dumps(LABELS))
    run = lambda *a: subprocess.run(a, check=True, capture_output=True, cwd=d)
    run("mksquashfs", "root", "root.sqfs", "-noappend", "-quiet")
    run("siftool", "new", "image.sif")
    run("siftool", "add", "image.sif", "image.def", "--datatype", "1")
    run("siftool", "add", "image.sif", "labels.json", "--datatype", "3", "--groupid", "1")
    add_rootfs(run)
    return d / "image.sif"


def test_read_matches_siftool(sif):
    info = read_sif(sif)
    listing = subprocess.run(["siftool", "list", str(sif)], capture_output=True, text=True, check=True).stdout
    assert info.version == "01" and info.arch == "amd64"
    assert [d.type for d in info.descriptors] == ["Def.FILE", "JSON.Labels", "FS"]
    for d in info.descriptors:  # same positions as `siftool list` prints
        assert f"{d.offset}-{d.offset + d.size}" in listing
    assert info.descriptors[2].extra == "Squashfs/PrimSys/amd64"
    assert info.definition == DEF and info.labels == LABELS
    header = subprocess.run(["siftool", "header", str(sif)], capture_output=True, text=True, check=True).stdout
    assert f"ID:                   {info.uuid}" in header


def test_inspect_cli_shows_definition_and_labels(sif):
    out = subprocess.run(
        [sys.executable, "-m", "hpctrain", "image", "inspect", str(sif)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "From: nvcr.io/nvidia/pytorch:23.12-py3" in out.stdout
    assert "hpctrain.version: 0.1.0" in out.stdout and "org.opencontainers.image.title: test image" in out.stdout
    js = subprocess.run(
        [sys.executable, "-m", "hpctrain", "image", "inspect", "--json", str(sif)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(js)["labels"] == LABELS


def test_truncated_sif_is_a_clear_error(sif, tmp_path):
    data = sif.read_bytes()
    cut = tmp_path / "cut.sif"
    cut.write_bytes(data[: len(data) - 1000])
    out = subprocess.run(
        [sys.executable, "-m", "hpctrain", "image", "inspect", str(cut)], capture_output=True, text=True
    )
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"hpctrain: error: {cut} is a truncated SIF file: the header says it holds "
        f"{len(data)} bytes but the file has {len(data) - 1000}; the copy or build "
        "was cut short — copy or build it again"
    )
    cut.write_bytes(data[:100])
    with pytest.raises(ImageError, match="truncated SIF file: 100 bytes, the header alone needs 128"):
        read_sif(cut)


def test_not_a_sif(tmp_path):
    f = tmp_path / "x.sif"
    f.write_bytes(b"\0" * 4096)
    with pytest.raises(ImageError, match="is not a SIF file"):
        read_sif(f)


def test_labels_and_definition_from_the_root_filesystem(tmp_path):
    """An image whose metadata lives only in /.singularity.d of its squashfs (as Apptainer writes it)."""
    meta = tmp_path / "root/.singularity.d"
    meta.mkdir(parents=True)
    (meta / "Singularity").write_text(DEF)
    (meta / "labels.json").write_text(json.dumps(LABELS))
    run = lambda *a: subprocess.run(a, check=True, capture_output=True, cwd=tmp_path)
    run("mksquashfs", "root", "root.sqfs", "-noappend", "-quiet")
    run("siftool", "new", "image.sif")
    add_rootfs(run)
    info = read_sif(tmp_path / "image.sif")
    assert [d.type for d in info.descriptors] == ["FS"]
    assert info.definition == DEF and info.labels == LABELS


def test_nested_label_object(tmp_path):
    (tmp_path / "labels.json").write_text(json.dumps({"system-partition": LABELS}))
    subprocess.run(["siftool", "new", "i.sif"], check=True, capture_output=True, cwd=tmp_path)
    subprocess.run(
        ["siftool", "add", "i.sif", "labels.json", "--datatype", "3"],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    assert read_sif(tmp_path / "i.sif").labels == LABELS

"""`hpctrain data prepare-imagenet`: val sorting, layout checks, bad files by path, exclusion list."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.data.prep.imagenet import prepare
from tests.helpers import WAIT_S


def cli(*args: str) -> subprocess.CompletedProcess:
    """The CLI in a process of its own; WAIT_S bounds a hang, not a timing (a loaded machine is slow)."""
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], capture_output=True, text=True, timeout=WAIT_S)


@pytest.fixture
def raw_imagenet(ident_root, tmp_path) -> tuple[Path, Path, list[Path]]:
    """ident_root with a flat val/ + ground-truth map, a truncated JPEG and a text file named .JPEG."""
    root = tmp_path / "imagenet"
    shutil.copytree(ident_root, root)
    lines = []
    for f in sorted((root / "val").glob("*/*.jpg")):
        lines.append(f"{f.name} {f.parent.name}")
        f.rename(root / "val" / f.name)
    for d in (root / "val").iterdir():
        if d.is_dir():
            d.rmdir()
    vmap = tmp_path / "val_map.txt"
    vmap.write_text("\n".join(lines) + "\n")
    trunc = root / "train" / "c05" / "broken.jpg"
    trunc.write_bytes((root / "train" / "c05" / "t005.jpg").read_bytes()[:500])
    text = root / "train" / "c07" / "n0000_notes.JPEG"
    text.write_text("not an image\n" * 40)
    return root, vmap, [trunc, text]


@pytest.mark.slow
def test_prepare_sorts_val_reports_bad_files_and_training_honours_the_list(raw_imagenet, tmp_path):
    pytest.importorskip("nvidia.dali")
    root, vmap, bad = raw_imagenet
    excl = tmp_path / "bad.txt"
    r = cli("data", "prepare-imagenet", str(root), "--val-map", str(vmap), "--exclude-bad", str(excl), "--workers", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "sorted 37 val images" in out and (root / "val" / "c00" / "v000.jpg").is_file()
    assert "train: 36 classes, 38 images" in out and "val: 36 classes, 37 images" in out
    assert "ImageNet-1k has 1,281,167" in out and "ImageNet-1k has 50,000" in out
    for p in bad:
        assert f"bad image: {p}" in out
    assert sorted(
        ln.split("#")[0].strip() for ln in excl.read_text().splitlines() if ln.strip() and not ln.startswith("#")
    ) == ["train/c05/broken.jpg", "train/c07/n0000_notes.JPEG"]

    # one optimizer step reads all 38 (or, excluded, 36) train images, then val is evaluated
    train = [
        "train",
        "-c",
        "digits_vit",
        "--set",
        f"data.root={root}",
        "--set",
        "data.prepare=none",
        "--set",
        "data.loader=dali",
        "--set",
        "data.workers=1",
        "--set",
        "model.num_classes=36",
        "--set",
        "model.img_size=24",
        "--set",
        "train.epochs=1",
        "--set",
        "data.global_batch=36",
        "--set",
        f"run.dir={tmp_path / 'runs'}",
        "--set",
        "train.eval_every_epochs=1",
    ]
    ok = cli(*train, "--set", "run.name=excl", "--set", f"data.exclude_file={excl}")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "val top-1" in ok.stderr and "37" in ok.stderr
    fail = cli(*train, "--set", "run.name=noexcl", "--set", "data.global_batch=38")
    if fail.returncode == -11:  # DALI 2.4.0's CPU decoder once died of SIGSEGV on the truncated JPEG
        # (a full CI run at load ~5: "[jpeg_parser] Invalid marker" twice, then the signal) where it
        # otherwise raises the decode error: DALI's, not ours; one more try, and a second crash fails
        fail = cli(*train, "--set", "run.name=noexcl2", "--set", "data.global_batch=38")
    assert fail.returncode == 2, fail.stderr[-2000:]
    last = fail.stderr.strip().splitlines()[-1]
    assert last.startswith("hpctrain: error: cannot decode image ")
    assert str(bad[0]) in last or str(bad[1]) in last
    assert "exclude_file" in last


def test_layout_problems_are_listed(ident_root, tmp_path):
    root = tmp_path / "ds"
    shutil.copytree(ident_root, root)
    (root / "train" / "empty_class").mkdir()
    (root / "val" / "stranger").mkdir()
    shutil.copy(root / "val" / "c00" / "v000.jpg", root / "val" / "stranger" / "x.jpg")
    shutil.copy(root / "val" / "c00" / "v000.jpg", root / "val" / "loose.jpg")
    rep = prepare(root, scan=False, log=lambda *_: None)
    text = "\n".join(rep.problems)
    assert "train: 1 empty class folders: empty_class" in text
    assert "val: 1 classes that train/ lacks: stranger" in text
    assert "images outside class folders (e.g. loose.jpg)" in text
    r = cli("data", "prepare-imagenet", str(root), "--no-scan")
    assert r.returncode == 1 and "problem: " in r.stdout


def test_val_map_errors_are_clear(ident_root, tmp_path):
    r = cli("data", "prepare-imagenet", str(ident_root), "--val-map", str(tmp_path / "missing.csv"))
    assert r.returncode == 2 and "--val-map" in r.stderr and "does not exist" in r.stderr
    bad = tmp_path / "devkit.txt"
    bad.write_text("490\n361\n")
    r = cli("data", "prepare-imagenet", str(ident_root), "--val-map", str(bad))
    assert r.returncode == 2 and "expected `<file name> <class folder>`" in r.stderr


def test_parallel_decode_check_finds_the_same_bad_files_in_the_same_order(raw_imagenet):
    """3 processes list what one process lists, in the same (sorted path) order, with a progress line."""
    root, _, _ = raw_imagenet
    for cls in ("c01", "c20", "c33"):  # more bad files, spread over the listing
        good = next((root / "train" / cls).glob("*.jpg"))
        (root / "train" / cls / f"cut_{cls}.jpg").write_bytes(good.read_bytes()[:300])
    (root / "val" / "v005.jpg").write_bytes(b"")
    reports, logs = [], []
    for workers in (1, 3):
        lines: list[str] = []
        reports.append(prepare(root, workers=workers, log=lines.append))
        logs.append(lines)
    serial, parallel = reports
    assert len(serial.bad) == 6 and parallel.bad == serial.bad
    assert [rel for rel, _ in serial.bad] == sorted(rel for rel, _ in serial.bad)
    assert ("val/v005.jpg", "empty file") in serial.bad
    assert any(
        s.startswith("decoding train: 41/41 images") and "(3 worker(s)): 5 do not decode" in s for s in logs[1]
    ), logs[1]

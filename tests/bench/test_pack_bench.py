"""bench/pack.py runs, finds the 1- and N-process packs identical, and reports ratios and MB/s."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_pack_bench_smoke_run():
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "pack.py"),
            "--images",
            "48",
            "--shard-size",
            "8",
            "--workers",
            "2",
            "--rounds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "packs identical: True" in r.stdout
    assert "pack speed-up 2 vs 1: " in r.stdout and "decode check: " in r.stdout
    assert "staged 12 files" in r.stdout and r.stdout.rstrip().endswith("MB/s")

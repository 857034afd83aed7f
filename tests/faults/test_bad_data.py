"""Data files vanish or go bad mid-run: an error naming the file, or skip-and-count."""

from __future__ import annotations

import shutil

import pytest

from tests.faults.local import start_ranks, wait_for_step
from tests.helpers import run_metrics


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_files_vanish_mid_run(policy, digits_root, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(digits_root, root)
    sets = ["train.max_steps=60", f"data.on_bad_sample={policy}", "data.workers=0"]
    procs = start_ranks(1, root, tmp_path, "vanish", *sets)
    wait_for_step(tmp_path / "vanish", 2, procs)
    gone = sorted((root / "train" / "7").iterdir())
    for p in gone:
        p.unlink()
    out, _ = procs[0].communicate(timeout=300)
    if policy == "stop":
        assert procs[0].returncode == 2, out[-2000:]
        err = [x for x in out.splitlines() if x.startswith("hpctrain: error:")]
        assert len(err) == 1 and "cannot decode image" in err[0]
        assert any(str(p) in err[0] for p in gone), err[0]
    else:
        assert procs[0].returncode == 0, out[-2000:]
        assert "skipped unreadable image" in out and str(root / "train" / "7") in out
        lines = run_metrics(tmp_path / "vanish")
        counts = [x.get("skipped_samples", 0) for x in lines if x["kind"] == "train"]
        assert counts[-1] > 0 and counts[-1] <= len(gone) * 3

"""Disk full during a checkpoint: the previous one stays intact; stop or continue as configured."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from hpctrain.train import checkpoint as ckpt
from tests.faults.local import start_ranks, wait_for_step
from tests.helpers import digits_args, run_ranks


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(mnt):
    """Take all the space that is left."""
    with open(mnt / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass


@pytest.mark.parametrize("policy", ["stop", "continue"])
def test_disk_full_keeps_previous_checkpoint(policy, digits_root, small_fs):
    sets = ["train.max_steps=40", "train.ckpt_every=10", "train.log_every=1", f"train.on_ckpt_error={policy}",
            "train.keep_ckpts=2"]
    procs = start_ranks(1, digits_root, small_fs, "full", *sets)
    run = small_fs / "full"
    wait_for_step(run, 12, procs)  # step-10 checkpoint written
    fill(small_fs)
    out, _ = procs[0].communicate(timeout=300)
    names = [p.name for p in ckpt.list_checkpoints(run)]
    assert names[-1] == "step-00000010.pt"
    assert ckpt.load(ckpt.ckpt_dir(run) / "step-00000010.pt")["step"] == 10  # intact
    assert not list(ckpt.ckpt_dir(run).glob(".*.tmp-*"))  # no half-written leftovers
    assert "No space left on device" in out and "the previous checkpoint step-00000010.pt is intact" in out
    if policy == "stop":
        assert procs[0].returncode == 2
        assert "hpctrain: error: could not write checkpoint" in out
    else:
        assert procs[0].returncode == 0, out[-2000:]
        assert "train.on_ckpt_error=continue" in out and re.search(r"status +finished", out)
    # with space again, --resume auto goes on from the intact checkpoint
    (small_fs / "filler").unlink()
    shutil.rmtree(run / "logs", ignore_errors=True)
    if policy == "stop":
        r = run_ranks(1, digits_args(digits_root, small_fs, "full", *sets))
        assert "at step 10" in r[0].stdout

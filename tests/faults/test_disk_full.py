"""Disk full during a checkpoint: the previous one stays intact; stop or continue as configured."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from hpctrain.train import compat
from hpctrain.train.ckpt import checkpoint as ckpt
from tests.faults.local import start_ranks, wait_for_step
from tests.helpers import digits_args, run_ranks, wait_for


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


@pytest.mark.slow
@pytest.mark.parametrize(
    ("policy", "mode"), [("stop", "single"), ("continue", "single"), ("stop", "async"), ("continue", "async")]
)
def test_disk_full_keeps_previous_checkpoint(policy, mode, digits_root, small_fs):
    """`async`: sharded checkpoints saved in the background; the save of step 20 fails there and the
    failure is settled when the next save starts (step 30), on every rank alike."""
    if mode == "async" and compat.version_tuple() < compat.SHARDED_MIN_TORCH:
        pytest.skip(f"background saves need torch >= 2.4; this is {compat.torch.__version__}")
    fmt = "single" if mode == "single" else "sharded"
    sets = [
        "train.max_steps=40",
        "ckpt.every=10",
        "log.every=1",
        f"ckpt.on_error={policy}",
        "ckpt.keep=2",
        f"ckpt.format={fmt}",
        f"ckpt.async_save={mode == 'async'}",
    ]
    # async: steps of 0.5 s (a sleep for data: the arithmetic is unchanged), so that the background
    # save of step 10 ends well before step 20's save starts, however loaded the machine is
    slow = {"HPCTRAIN_TEST_DELAY": "0:0.5:data"} if mode == "async" else {}
    procs = start_ranks(1, digits_root, small_fs, "full", *sets, env=slow)
    run = small_fs / "full"
    wait_for_step(run, 12, procs)
    first = ckpt.name(10, fmt)  # written in full (a background save may still run at step 12 under load)
    wait_for(lambda: [p.name for p in ckpt.list_checkpoints(run)] == [first] or None, f"no {first}", 120, poll_s=0.1)
    fill(small_fs)
    out, _ = procs[0].communicate(timeout=300)
    names = [p.name for p in ckpt.list_checkpoints(run)]
    assert names[-1] == first
    assert ckpt.load(ckpt.ckpt_dir(run) / first)["step"] == 10  # intact
    assert (ckpt.ckpt_dir(run) / "latest").read_text().strip() == first
    assert not list(ckpt.ckpt_dir(run).glob(".*.tmp*"))  # no half-written leftovers
    assert "No space left on device" in out and f"the previous checkpoint {first} is intact" in out
    if policy == "stop":
        assert procs[0].returncode == 2
        assert "hpctrain: error: could not write checkpoint" in out
        if mode == "async":  # step 20's failure, reported when step 30's save waited for it
            assert re.search(r"could not write checkpoint \S*step-00000020", out)
    else:
        assert procs[0].returncode == 0, out[-2000:]
        assert "ckpt.on_error=continue" in out and re.search(r"status +finished", out)
    # with space again, --resume auto goes on from the intact checkpoint
    (small_fs / "filler").unlink()
    shutil.rmtree(run / "logs", ignore_errors=True)
    if policy == "stop":
        r = run_ranks(1, digits_args(digits_root, small_fs, "full", *sets))
        assert "at step 10" in r[0].stdout

"""Checkpoints are atomic, load safely, and `--resume auto` finds the newest good one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from hpctrain.train import compat
from hpctrain.train.ckpt import checkpoint as ckpt

WRITER = """
import sys, torch
from hpctrain.train.ckpt import checkpoint as ckpt
from hpctrain.train import compat
run = sys.argv[1]
ckpt.save(run, 1, {"model": {"w": torch.ones(3)}, "step": 1}, keep=3)
print("first saved", flush=True)
# ~400 MB: long enough to be killed while it is being written
ckpt.save(run, 2, {"model": {"w": torch.zeros(100_000_000)}, "step": 2}, keep=3)
print("second saved", flush=True)
"""


@pytest.mark.slow
def test_sigkill_during_write_leaves_previous_loadable(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "first saved"
    d = ckpt.ckpt_dir(tmp_path)
    deadline = time.time() + 60
    while not list(d.glob(".step-00000002.pt.tmp-*")):
        assert time.time() < deadline and p.poll() is None, "the second write never started"
        time.sleep(0.001)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert not (d / "step-00000002.pt").exists()  # no half file under a real name
    assert (d / "latest").read_text().strip() == "step-00000001.pt"
    path, state = ckpt.find_resume(tmp_path, "auto")
    assert path.name == "step-00000001.pt" and state["step"] == 1
    assert torch.equal(state["model"]["w"], torch.ones(3))
    # the next save clears the leftover temp file
    ckpt.save(tmp_path, 3, {"model": {}, "step": 3}, keep=3)
    assert not list(d.glob(".*.tmp-*"))


def test_auto_resume_skips_a_corrupt_newest(tmp_path, hpctrain_log):
    # a training run earlier in this process may have set up the "hpctrain" logger without propagation
    for step in (1, 2):
        ckpt.save(tmp_path, step, {"model": {"w": torch.full((1000,), float(step))}, "step": step}, keep=3)
    newest = ckpt.ckpt_dir(tmp_path) / "step-00000002.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    with hpctrain_log.at_level("WARNING", logger="hpctrain"):
        path, state = ckpt.find_resume(tmp_path, "auto")
    assert state["step"] == 1 and path.name == "step-00000001.pt"
    assert "step-00000002.pt" in hpctrain_log.text and "falling back" in hpctrain_log.text


def test_keep_last_k(tmp_path):
    for step in range(1, 6):
        ckpt.save(tmp_path, step, {"model": {}, "step": step}, keep=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000005.pt", "step-00000004.pt"]


class Payload:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_pickled_objects_are_refused(tmp_path):
    bad = tmp_path / "evil.pt"
    torch.save({"model": {}, "step": 1, "extra": Payload()}, bad)
    with pytest.raises(ckpt.CheckpointError, match="cannot be loaded safely"):
        ckpt.load(bad)
    assert not (tmp_path / "pwned").exists() and not os.path.exists("pwned")


def test_none_and_missing(tmp_path):
    assert ckpt.find_resume(tmp_path, "none") is None
    assert ckpt.find_resume(tmp_path, "auto") is None
    with pytest.raises(ckpt.CheckpointError, match="no such checkpoint; give auto, none or a checkpoint path"):
        ckpt.find_resume(tmp_path, str(tmp_path / "nope.pt"))
    with pytest.raises(ckpt.CheckpointError, match=r"run.resume='nonee': no such checkpoint"):
        ckpt.find_resume(tmp_path, "nonee")  # a misspelt `none`


@pytest.mark.skipif(
    compat.version_tuple() < compat.SHARDED_MIN_TORCH,
    reason=f"sharded checkpoints need torch >= 2.4; this is {torch.__version__}",
)
def test_both_formats_in_one_directory(tmp_path, hpctrain_log):
    """A run that changed format (1 rank, then 2) lists, resumes and prunes both kinds alike; a
    sharded checkpoint without DCP's .metadata (an incomplete copy) is skipped."""
    from hpctrain.train.ckpt import sharded

    ckpt.save(tmp_path, 1, {"model": {"w": torch.ones(3)}, "step": 1}, keep=3)
    for step in (2, 3):  # one process, no process group: DCP writes all of it
        path, err = sharded.save(
            tmp_path, step, {"model": {"w": torch.full((3,), float(step))}}, {"step": step}, keep=3, is_main=True
        )
        assert err is None and path.name == ckpt.name(step, "sharded")
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000003", "step-00000002", "step-00000001.pt"]
    assert (ckpt.ckpt_dir(tmp_path) / "latest").read_text().strip() == "step-00000003"
    assert torch.equal(ckpt.load(ckpt.ckpt_dir(tmp_path) / "step-00000003")["model"]["w"], torch.full((3,), 3.0))
    (ckpt.ckpt_dir(tmp_path) / "step-00000003" / ".metadata").unlink()
    with hpctrain_log.at_level("WARNING", logger="hpctrain"):
        path, st = ckpt.find_resume(tmp_path, "auto")
    assert path.name == "step-00000002" and st["step"] == 2 and "no DCP .metadata" in hpctrain_log.text
    sharded.save(tmp_path, 4, {"model": {"w": torch.zeros(3)}}, {"step": 4}, keep=2, is_main=True)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000004", "step-00000003"]


@pytest.mark.skipif(
    compat.version_tuple() < compat.SHARDED_MIN_TORCH,
    reason=f"sharded checkpoints need torch >= 2.4; this is {torch.__version__}",
)
def test_one_step_is_never_on_disk_in_two_formats(tmp_path):
    """Both formats of one step (what older releases left after rerunning a finished run with another
    world size) list as one, `latest`'s; saving that step again replaces the other; pruning takes both."""
    from hpctrain.train.ckpt import sharded

    d = ckpt.ckpt_dir(tmp_path)
    sharded.save(tmp_path, 5, {"model": {"w": torch.ones(3)}}, {"step": 5}, keep=3, is_main=True)
    (d / "step-00000005.pt").write_bytes(b"")  # an older release's second copy, then `latest` back on the first
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000005"]
    ckpt.save(tmp_path, 5, {"model": {"w": torch.zeros(3)}, "step": 5}, keep=3)  # the step saved again
    assert sorted(p.name for p in d.iterdir()) == ["latest", "step-00000005.pt"]
    (d / "step-00000005").mkdir()  # and once more in the other format, then two newer steps
    for step in (6, 7):
        ckpt.save(tmp_path, step, {"model": {}, "step": step}, keep=2)
    assert sorted(p.name for p in d.iterdir()) == ["latest", "step-00000006.pt", "step-00000007.pt"]

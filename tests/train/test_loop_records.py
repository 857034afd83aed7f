"""What a stopped and resumed run leaves behind: evals, checkpoints, metric lines and rank logs.

The digits config has 22 steps per epoch at batch 64 (world 1); the tests check that where it
matters, so a change to the data set shows up as such rather than as a missing record.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from hpctrain.train.ckpt import checkpoint as ckpt
from tests.helpers import digits_args, run_metrics, run_ranks

EPOCH = 22  # steps per epoch of digits at batch 64


def steps(run_dir, kind: str) -> list[int]:
    return [r["step"] for r in run_metrics(run_dir, kind)]


@pytest.mark.slow
def test_stop_at_epoch_end_evaluates_after_resume(digits_root, tmp_path):
    sets = ["train.max_steps=24", "train.eval_every_epochs=1", "log.every=4"]
    run_ranks(1, digits_args(digits_root, tmp_path, "straight", *sets, "run.resume=none"))
    assert steps(tmp_path / "straight", "eval") == [EPOCH, 24]
    run_ranks(1, digits_args(digits_root, tmp_path, "split", *sets, f"--halt-at={EPOCH}"))
    assert steps(tmp_path / "split", "stop") == [EPOCH] and steps(tmp_path / "split", "eval") == []
    run_ranks(1, digits_args(digits_root, tmp_path, "split", *sets))
    assert steps(tmp_path / "split", "eval") == [EPOCH, 24]
    straight, split = run_metrics(tmp_path / "straight", "eval"), run_metrics(tmp_path / "split", "eval")
    assert [r["top1"] for r in split] == [r["top1"] for r in straight]


@pytest.mark.slow
def test_old_checkpoint_without_eval_pending_still_resumes(digits_root, tmp_path):
    sets = ["train.max_steps=6", "log.every=3"]
    run_ranks(1, digits_args(digits_root, tmp_path, "r", *sets, "--halt-at=3"))
    path = ckpt.list_checkpoints(tmp_path / "r")[0]
    st = ckpt.load(path)
    st.pop("eval_pending", None)  # as written before the key existed
    ckpt.save(tmp_path / "r", 3, st, keep=2)
    run_ranks(1, digits_args(digits_root, tmp_path, "r", *sets))
    assert steps(tmp_path / "r", "eval") == [6] and steps(tmp_path / "r", "end") == [6]


@pytest.mark.slow
def test_stop_on_a_checkpoint_step_saves_once(digits_root, tmp_path):
    run_ranks(1, digits_args(digits_root, tmp_path, "r", "train.max_steps=8", "ckpt.every=2", "--halt-at=4"))
    assert steps(tmp_path / "r", "checkpoint") == [2, 4]
    assert steps(tmp_path / "r", "stop") == [4]


@pytest.mark.slow
def test_resume_from_an_older_checkpoint_supersedes_later_records(digits_root, tmp_path):
    # The first attempt checkpoints at the epoch end (eval still due), evaluates, trains on and
    # finishes; resuming from that checkpoint replays everything after it, that eval included.
    sets = ["train.max_steps=26", f"ckpt.every={EPOCH}", "train.eval_every_epochs=1", "ckpt.keep=3"]
    run = tmp_path / "r"
    run_ranks(1, digits_args(digits_root, tmp_path, "r", *sets))
    first = run_metrics(run)
    assert steps(run, "eval") == [EPOCH, 26] and steps(run, "checkpoint") == [EPOCH, 26]
    older = ckpt.ckpt_dir(run) / f"step-{EPOCH:08d}.pt"
    run_ranks(1, digits_args(digits_root, tmp_path, "r", *sets, f"run.resume={older}"))
    for kind in ("train", "eval", "checkpoint", "end"):
        s = steps(run, kind)
        assert s == sorted(set(s)), f"{kind} steps not strictly increasing: {s}"
    assert steps(run, "train") == list(range(1, 27)) and steps(run, "eval") == [EPOCH, 26]
    moved = [json.loads(line) for line in (run / "metrics.superseded.jsonl").read_text().splitlines()]
    replayed = [r for r in first if r["step"] > EPOCH or (r["kind"] == "eval" and r["step"] == EPOCH)]
    assert moved == replayed  # nothing lost: every replaced record is kept, in order
    assert [r["top1"] for r in run_metrics(run, "eval")] == [r["top1"] for r in first if r["kind"] == "eval"]


PROGRESS = re.compile(r"step (\d+)/8 .*loss \d+\.\d+ lr \S+ \d+ img/s data \d+%")


@pytest.mark.slow
def test_rank_logs_carry_progress_lines(digits_root, tmp_path):
    out = run_ranks(2, digits_args(digits_root, tmp_path, "r", "train.max_steps=8", "log.every=4"))
    for rank in (0, 1):
        text = (tmp_path / "r" / "logs" / f"rank-{rank}.log").read_text()
        assert [int(m.group(1)) for m in PROGRESS.finditer(text)] == [4, 8], text
    console = [int(m.group(1)) for m in PROGRESS.finditer(out[0].stdout)]
    assert console == [4, 8], out[0].stdout  # Progress prints there; the log line does not repeat it


@pytest.mark.slow
def test_grad_norm_in_every_train_record_with_clipping_off(digits_root, tmp_path):
    """Clipping off logs the same total gradient norm that clip_grad_norm_ returns (a clip at 1e6
    never clips: its factor is clamped to 1), and computing it leaves the trajectory as it was."""
    sets = ["train.max_steps=6", "log.every=1"]
    run_ranks(1, digits_args(digits_root, tmp_path, "noclip", *sets, "optim.clip_grad=0"))
    run_ranks(1, digits_args(digits_root, tmp_path, "clip", *sets, "optim.clip_grad=1e6"))
    off, clip = run_metrics(tmp_path / "noclip", "train"), run_metrics(tmp_path / "clip", "train")
    assert [r["step"] for r in off] == list(range(1, 7)) and all(r["grad_norm"] > 0 for r in off)
    assert [r["grad_norm"] for r in off] == [r["grad_norm"] for r in clip]
    assert [r["loss"] for r in off] == [r["loss"] for r in clip]
    a, b = (ckpt.load(ckpt.list_checkpoints(tmp_path / name)[0])["model"] for name in ("noclip", "clip"))
    assert all(torch.equal(a[k], b[k]) for k in a)

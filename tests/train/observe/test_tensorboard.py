"""TensorBoard event files: the same numbers as metrics.jsonl, one point per step and tag across a
stop and a resume from an older checkpoint (whose replayed steps the first attempt had logged)."""

from __future__ import annotations

import logging
import sys

import pytest
from tensorboard.backend.event_processing import event_accumulator as ea

from hpctrain.config import load
from hpctrain.train.ckpt import checkpoint as ckpt
from hpctrain.train.entry import run as train
from hpctrain.train.observe import trackers
from hpctrain.train.observe.tensorboard import open_sink, scalars
from tests.fs_events import Inotify
from tests.helpers import halt_at, run_metrics

EPOCH = 22  # steps per epoch of digits at batch 64 (world 1)


def digits(root, run_dir, *sets: str):
    """The digits demo config, trained in this process (a subprocess costs ~7 s of CPU to start)."""
    return load(
        "digits_vit",
        [
            f"data.root={root}",
            "data.prepare=none",
            f"run.dir={run_dir}",
            "run.name=r",
            "train.threads=1",
            "log.every=1",
            *sets,
        ],
    )


def read_tb(tb_dir, purge: bool = True) -> ea.EventAccumulator:
    acc = ea.EventAccumulator(str(tb_dir), size_guidance={ea.SCALARS: 0}, purge_orphaned_data=purge)
    return acc.Reload()


def expected(run_dir) -> dict[str, dict[int, float]]:
    """tag → {step: value} from metrics.jsonl: every numeric field of train, eval and goodput records."""
    out: dict[str, dict[int, float]] = {}
    for rec in run_metrics(run_dir):
        if rec["kind"] not in ("train", "eval", "goodput"):
            continue
        for k, v in rec.items():
            if k not in ("kind", "step", "time", "epoch") and isinstance(v, (int, float)) and not isinstance(v, bool):
                out.setdefault(f"{rec['kind']}/{k}", {})[rec["step"]] = v
    return out


def test_stop_and_resume_from_older_checkpoint_gives_one_curve(digits_root, tmp_path):
    sets = [
        "train.max_steps=26",
        f"ckpt.every={EPOCH}",
        "train.eval_every_epochs=1",
        "ckpt.keep=3",
        "train.ema=0.9",
        "log.trackers=[tensorboard]",
    ]
    run = tmp_path / "r"
    # attempt 1: checkpoint and eval at 22, trains on, stops at 24
    with halt_at(24):
        assert train(digits(digits_root, tmp_path, *sets))["status"] == "halted"
    assert [r["step"] for r in run_metrics(run, "stop")] == [24]
    # attempt 2 resumes at 22: it replays the eval at 22 and steps 23, 24 that attempt 1 logged
    older = ckpt.ckpt_dir(run) / f"step-{EPOCH:08d}.pt"
    assert train(digits(digits_root, tmp_path, *sets, f"run.resume={older}"))["resumed_from"] == EPOCH
    assert len(list((run / "tb").glob("events.out.tfevents.*"))) == 2

    raw = read_tb(run / "tb", purge=False)  # the test can fail: without the purge, steps repeat
    assert [e.step for e in raw.Scalars("train/loss")].count(23) == 2
    assert [e.step for e in raw.Scalars("eval/top1")].count(EPOCH) == 2

    acc, want = read_tb(run / "tb"), expected(run)
    assert {
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "train/images_per_s",
        "train/data_wait",
        "eval/top1",
        "eval/top5",
        "eval/loss",
        "eval/ema_top1",
    } <= set(want)
    assert set(acc.Tags()["scalars"]) == set(want)
    jsonl_time = {r["step"]: r["time"] for r in run_metrics(run, "train")}
    for tag, points in want.items():
        events = acc.Scalars(tag)
        steps = [e.step for e in events]
        assert steps == sorted(points), f"{tag}: {steps}"  # each step once, in order
        assert [e.value for e in events] == pytest.approx([points[s] for s in steps], rel=1e-6), tag
        if tag.startswith("train/"):
            assert [e.wall_time for e in events] == pytest.approx([jsonl_time[s] for s in steps])
    assert sorted(want["train/loss"]) == list(range(1, 27)) and sorted(want["eval/top1"]) == [EPOCH, 26]


def test_without_tensorboard_one_warning_and_no_directory(tmp_path, monkeypatch, hpctrain_log):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # what a missing package raises
    with hpctrain_log.at_level(logging.WARNING, logger="hpctrain"):
        assert open_sink(tmp_path) is None
    assert [r.levelno for r in hpctrain_log.records] == [logging.WARNING]
    assert "pip install tensorboard" in hpctrain_log.text
    off = load("digits_vit", ["log.trackers=[]"])  # TensorBoard left out of log.trackers: no sink, no directory
    assert trackers.open_sink(off, tmp_path) is None and not (tmp_path / "tb").exists()


def test_gpu_entries_become_per_gpu_tags():
    rec = {
        "kind": "train",
        "time": 1.0,
        "step": 40,
        "epoch": 0.5,
        "loss": 2.5,
        "skipped": True,
        "gpus": [{"index": 0, "util_pct": 97, "power_w": 650.5}, {"index": 3, "util_pct": 12, "name": "H200"}],
    }
    assert scalars(rec) == {"train/loss": 2.5, "gpu0/util_pct": 97.0, "gpu0/power_w": 650.5, "gpu3/util_pct": 12.0}
    assert scalars({"kind": "checkpoint", "step": 40, "time": 1.0}) == {}


def test_event_file_is_opened_once_for_the_run(tmp_path):
    """One open of the event file however many scalars are written (tensorboard's stub gfile opens it
    for each event: a parallel file system's metadata server serves every open), and TensorBoard
    reads back every point, the last ones written by `close`."""
    (tmp_path / "tb").mkdir()  # watched from the start (a directory made later is watched a moment after)
    watcher = Inotify(tmp_path)
    sink = open_sink(tmp_path)
    for step in range(1, 41):
        sink.record({"kind": "train", "time": float(step), "step": step, "loss": 1.0 / step, "lr": 0.1})
    sink.record({"kind": "checkpoint", "time": 41.0, "step": 40})  # a flush
    sink.close()
    events = watcher.close()
    (event_file,) = (tmp_path / "tb").iterdir()
    opens = [path for _, op, path in events if op == "open" and path == f"tb/{event_file.name}"]
    assert len(opens) <= 2, opens  # tensorboard's own first write, then the file held open
    acc = read_tb(tmp_path / "tb")
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(1, 41))
    assert [e.value for e in acc.Scalars("train/lr")] == pytest.approx([0.1] * 40)

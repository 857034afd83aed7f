"""Progress and ETA from metrics records (hpctrain.watch.progress): synthetic timelines."""

from __future__ import annotations

import io
import json
import time

import pytest

from hpctrain.run.metrics import supersede
from hpctrain.watch.progress import (
    RECHECK_S,
    MetricsTail,
    duration,
    eta,
    progress_line,
    recent_straggler,
    run_requeue_waits,
    steps_per_s,
    total_steps,
    watch,
)
from tests.fs_events import Inotify

T0 = 1_700_000_000.0


def train(step: int, t: float, spe: int = 20, **extra) -> dict:
    return {"kind": "train", "time": t, "step": step, "epoch": step / spe, "loss": 1.0, "images_per_s": 64.0, **extra}


def attempt(first: int, last: int, every: int, t0: float, step_s: float) -> list[dict]:
    """`train` records every `every` steps from `first` to `last`, one step each `step_s` seconds."""
    return [train(s, t0 + (s - first + every) * step_s) for s in range(first, last + 1, every)]


def test_rate_is_the_latest_attempts_and_ignores_a_gap_but_not_an_eval():
    recs = attempt(10, 100, 10, T0, 0.5)
    recs.insert(5, {"kind": "eval", "time": recs[4]["time"] + 1.0, "step": 50, "top1": 50.0, "top5": 90.0})
    for r in recs[5:]:
        r["time"] += 1.0  # the eval's second is part of the run's time
    late = attempt(110, 150, 10, recs[-1]["time"] + 3600, 0.5)  # a crash and requeue without a stop record
    # the last 10 intervals, 50 → 150: the one across the gap left out, 9 of 10 steps × 0.5 s, + the eval's 1 s
    assert steps_per_s(recs + late) == pytest.approx(90 / (9 * 5.0 + 1.0))
    stop = {"kind": "stop", "time": late[-1]["time"] + 1, "step": 150, "stop_kind": "preemption"}
    faster = attempt(160, 200, 10, stop["time"] + 60, 0.25)  # requeued onto faster nodes
    assert steps_per_s([*recs, *late, stop, *faster]) == pytest.approx(4.0)


def test_rate_from_one_record_uses_step_time_or_images_per_s():
    assert steps_per_s([train(20, T0, step_time_s=0.2)]) == pytest.approx(5.0)
    assert steps_per_s([train(20, T0)], global_batch=32) == pytest.approx(2.0)
    assert steps_per_s([train(20, T0)]) is None
    assert steps_per_s([]) is None


def test_total_steps_from_max_steps_or_epochs_times_steps_per_epoch():
    recs = [train(7, T0, spe=23)]
    assert total_steps({"train": {"max_steps": 50, "epochs": 30}}, recs) == 50
    assert total_steps({"train": {"max_steps": 0, "epochs": 30}}, recs) == 30 * 23
    assert total_steps({"train": {"epochs": 30}}, []) is None
    assert total_steps({}, recs) is None


def test_eta_while_running_counts_from_the_last_record():
    recs = attempt(10, 100, 10, T0, 0.5)
    now = recs[-1]["time"] + 5
    e = eta(recs, 300, now, waiting=False, rate=steps_per_s(recs))
    assert e.at == pytest.approx(recs[-1]["time"] + 200 * 0.5)
    assert e.seconds == pytest.approx(e.at - now)
    assert eta(
        [*recs, {"kind": "end", "time": now, "step": 300, "status": "finished"}], 300, now + 9, False, 2.0
    ) == type(e)(0.0, now, "finished")
    assert eta(recs, None, now, False, 2.0).seconds is None
    more = [*recs, {"kind": "end", "time": now, "step": 100, "status": "finished"}, train(110, now + 30)]
    assert eta(more, 300, now + 30, False, 2.0).seconds == pytest.approx(190 / 2.0)  # resumed for more steps


def requeued_timeline(wait_s: float, step_s: float) -> list[dict]:
    """Train to 40, stop, wait `wait_s` in the queue, resume and log after 10 more steps, stop at 80."""
    first = attempt(10, 40, 10, T0, step_s)
    stop1 = {"kind": "stop", "time": first[-1]["time"] + 2, "step": 40, "stop_kind": "time_limit"}
    req1 = {"kind": "requeue", "time": stop1["time"] + 0.5, "step": 40, "requeue": True, "reason": "time_limit"}
    second = attempt(50, 80, 10, stop1["time"] + wait_s, step_s)
    stop2 = {"kind": "stop", "time": second[-1]["time"] + 2, "step": 80, "stop_kind": "preemption"}
    return [*first, stop1, req1, *second, stop2]


def test_eta_while_pending_adds_the_mean_past_queue_wait():
    recs = requeued_timeline(wait_s=600, step_s=0.5)
    rate = steps_per_s(recs)
    assert rate == pytest.approx(2.0)
    assert run_requeue_waits(recs, rate) == [pytest.approx(600)]  # the first record comes 10 steps after the start
    stop2 = recs[-1]
    now = stop2["time"] + 100
    e = eta(recs, 200, now, waiting=True, rate=rate)
    assert e.at == pytest.approx(stop2["time"] + 600 + 120 * 0.5) and e.seconds == pytest.approx(e.at - now)
    late = stop2["time"] + 5000  # already waiting longer than ever before: from now on
    assert eta(recs, 200, late, True, rate).seconds == pytest.approx(120 * 0.5)


def test_eta_while_pending_without_a_past_requeue_says_after_it_starts():
    recs = attempt(10, 40, 10, T0, 0.5) + [{"kind": "stop", "time": T0 + 30, "step": 40}]
    e = eta(recs, 200, T0 + 100, waiting=True, rate=2.0)
    assert e.seconds is None and e.note.startswith("after it starts")
    assert eta([], 200, T0, waiting=True, rate=None).note == "after it starts"


def test_straggler_shown_only_while_recent():
    recs = attempt(10, 50, 10, T0, 0.5)
    strag = {
        "kind": "straggler",
        "time": T0,
        "step": 40,
        "rank": 3,
        "host": "n2",
        "gpu": 1,
        "step_time_s": 0.7,
        "median_s": 0.5,
        "slower_pct": 40.0,
        "cause": "data",
        "data_wait_s": 0.2,
    }
    assert recent_straggler([*recs[:4], strag, recs[4]]) == strag
    assert recent_straggler([*recs[:4], strag, *attempt(60, 80, 10, T0 + 100, 0.5)]) is None
    assert recent_straggler(recs) is None


def test_progress_line_shows_mfu_only_when_recorded():
    recs = attempt(10, 40, 10, T0, 0.5)
    line = progress_line(recs, 100, recs[-1]["time"], None)
    assert line.startswith("step 40/100 (40%) · epoch 2.00 · loss 1.0000 · 64 img/s") and "ETA 30s" in line
    assert "MFU" not in line
    recs[-1]["mfu"] = 0.412
    assert "MFU 41.2%" in progress_line(recs, 100, recs[-1]["time"], None)
    assert progress_line([], 100, T0) == ""
    assert duration(59) == "59s" and duration(185) == "3m05s" and duration(7620) == "2h07m"


def test_tail_reads_complete_lines_and_rereads_a_replaced_file(tmp_path):
    """One open of the file while it grows (a follower polls it every second for days: each open is a
    request to a parallel file system's metadata server); a stat every RECHECK_S of silence finds the
    file once it appears and a replaced one (read again from its start)."""
    path = tmp_path / "metrics.jsonl"
    now = [0.0]
    tail = MetricsTail(path, clock=lambda: now[0])
    watcher = Inotify(tmp_path)
    assert tail.poll() == []
    path.write_text(json.dumps(train(1, T0)) + "\n" + '{"kind": "tra')  # the second line is being written
    assert tail.poll() == []  # looked for again only RECHECK_S later
    now[0] += RECHECK_S
    assert [r["step"] for r in tail.poll()] == [1]
    for step in range(2, 30):
        with open(path, "a") as f:
            f.write(f'in", "step": {step}}}\n{{"kind": "tra')
        assert [r["step"] for r in tail.poll()] == list(range(1, step + 1))
    time.sleep(0.2)
    opens = [p for _, op, p in watcher.close() if op == "open" and p == "metrics.jsonl"]
    assert len(opens) == 29, opens  # the tail's one, and the test's own 28 appends
    tmp = tmp_path / "new"
    tmp.write_text(json.dumps(train(1, T0)) + "\n")
    tmp.replace(path)  # what hpctrain.run.metrics.supersede does
    now[0] += RECHECK_S
    assert [r["step"] for r in tail.poll()] == [1]


def test_watch_prints_a_line_per_new_record_until_done(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.touch()
    steps = iter([None, 10, None, 20, 30])  # None: nothing new by that poll

    def done() -> bool:
        step = next(steps, "end")
        if step == "end":
            return True
        if step is not None:
            with open(path, "a") as f:
                f.write(json.dumps(train(step, T0 + step)) + "\n")
        return False

    out = io.StringIO()
    watch(tmp_path, done, {"train": {"max_steps": 30}}, out, every_s=0, poll_s=0)
    assert [line.split(" · ")[0] for line in out.getvalue().splitlines()] == [
        "step 10/30 (33%)",
        "step 20/30 (67%)",
        "step 30/30 (100%)",
    ]


def test_watch_on_a_terminal_rewrites_one_line(tmp_path):
    import os
    import pty

    path = tmp_path / "metrics.jsonl"
    path.touch()
    calls = iter([(10, False), (20, True)])

    def done() -> bool:  # the first poll sees step 10, the second step 20 and the job's end
        step, last = next(calls)
        with open(path, "a") as f:
            f.write(json.dumps(train(step, T0 + step)) + "\n")
        return last

    master, slave = pty.openpty()
    with os.fdopen(slave, "w") as out:
        watch(tmp_path, done, {"train": {"max_steps": 40}}, out, every_s=60, poll_s=0)
    chunks = []
    while True:  # until the closed slave side reads as the end (EIO on Linux)
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    shown = b"".join(chunks).decode()
    assert shown.endswith("\n") and shown.count("\n") == 1, repr(shown)  # one line, ended once at the end
    blank, first, second = shown.rstrip("\r\n").split("\r")  # (a terminal may write "\n" as "\r\n")
    assert not blank and first.startswith("step 10/40 (25%)") and second.startswith("step 20/40 (50%)"), repr(shown)


@pytest.mark.parametrize("superseded", [False, True], ids=["appended", "superseded"])
def test_watch_of_a_resumed_run_shows_only_the_new_attempts_progress(tmp_path, superseded):
    """The earlier attempt stopped at step 20 of 660 (its records in the file when the watch begins):
    the line waits for the new attempt's first step instead of showing `step 20/660 … ETA` of the old
    one. Resumed from step 20 its records are appended; from the checkpoint at step 14, the records
    past it are first moved out of the file (metrics.supersede, a replaced file the tail rereads)."""
    path = tmp_path / "metrics.jsonl"
    old = [*attempt(2, 20, 2, T0, 1.0), {"kind": "stop", "time": T0 + 21, "step": 20, "stop_kind": "interrupt"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in old))
    resumed = 14 if superseded else 20
    polls = iter([False, "resume", False, True])

    def done() -> bool:
        what = next(polls)
        if what == "resume":
            if superseded:
                supersede(path, lambda r: r.get("step", 0) > resumed)
            with open(path, "a") as f:
                f.write(json.dumps(train(resumed + 2, T0 + 100)) + "\n")
            return False
        return what

    out = io.StringIO()
    tail = MetricsTail(path, recheck_s=0)
    watch(tmp_path, done, {"train": {"max_steps": 660}}, out, every_s=0, poll_s=0, tail=tail)
    lines = out.getvalue().splitlines()
    assert [line.split(" · ")[0] for line in lines] == [f"step {resumed + 2}/660 ({100 * (resumed + 2) / 660:.0f}%)"], (
        lines
    )

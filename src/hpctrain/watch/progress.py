"""How far a run is and when it will end, from its metrics.jsonl records alone.

Pure functions over the records (each has `kind` and `time`, see metrics.py), shared by
`hpctrain status` and the progress line `hpctrain submit` prints while it waits. No torch:
this runs on login nodes.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, TextIO

from hpctrain.run.layout import METRICS
from hpctrain.run.metrics import total_steps

RATE_WINDOW = 10  # log intervals the recent steps/s is taken over
GAP_FACTOR = 10.0  # an interval this many times the median per-step time is a gap (crash, requeue), not speed


def _timed(records: list[dict], kind: str) -> list[dict]:
    return [
        r
        for r in records
        if r.get("kind") == kind and isinstance(r.get("time"), (int, float)) and isinstance(r.get("step"), (int, float))
    ]


def attempts(records: list[dict]) -> list[list[dict]]:
    """The records split after each `stop`: one allocation's run each (a requeue may change the speed)."""
    out: list[list[dict]] = [[]]
    for r in records:
        out[-1].append(r)
        if r.get("kind") == "stop":
            out.append([])
    return out


def steps_per_s(records: list[dict], global_batch: int | None = None) -> float | None:
    """Optimizer steps per second now, from the latest attempt that logged a `train` record.

    With two or more: over its last RATE_WINDOW log intervals, by their `step` and `time`; the
    evals and checkpoints in between count, as they count towards the end. An interval over
    GAP_FACTOR times the median is left out (a crash and requeue without a stop record). With
    one: its `step_time_s`, else `images_per_s` / the global batch.
    """
    for part in reversed(attempts(records)):
        train = _timed(part, "train")
        if len(train) >= 2:
            recent = train[-(RATE_WINDOW + 1) :]
            pairs = [(b["step"] - a["step"], b["time"] - a["time"]) for a, b in zip(recent, recent[1:])]
            pairs = [(n, dt) for n, dt in pairs if n > 0 and dt > 0]
            if pairs:
                median = statistics.median(dt / n for n, dt in pairs)
                kept = [(n, dt) for n, dt in pairs if dt / n <= GAP_FACTOR * median]
                return sum(n for n, _ in kept) / sum(dt for _, dt in kept)
        last = next((r for r in reversed(part) if r.get("kind") == "train"), None)
        if last and last.get("step_time_s"):
            return 1.0 / last["step_time_s"]
        if last and last.get("images_per_s") and global_batch:
            return last["images_per_s"] / global_batch
    return None


def run_requeue_waits(records: list[dict], rate: float | None) -> list[float]:
    """Seconds each past stop of this run cost before training went on: from the `stop` record to
    the first record of the resumed attempt, less the time its steps since the stop took at `rate`.
    (The `requeue` record after a stop is the stopped attempt's own.) The run's own view, from its
    records; plan/queue.py's `partition_requeue_waits` is Slurm's, over any job's attempts."""
    waits = []
    for i, stop in enumerate(records):
        if stop.get("kind") != "stop" or not isinstance(stop.get("time"), (int, float)):
            continue
        nxt = next(
            (r for r in records[i + 1 :] if r.get("kind") != "requeue" and isinstance(r.get("time"), (int, float))),
            None,
        )
        if nxt is None:
            continue
        trained = max(0, (nxt.get("step") or 0) - (stop.get("step") or 0))
        waits.append(max(0.0, nxt["time"] - stop["time"] - (trained / rate if rate else 0.0)))
    return waits


@dataclass(frozen=True)
class Eta:
    seconds: float | None  # from now; None when it cannot be told (`note` says why)
    at: float | None  # unix time
    note: str = ""


def eta(records: list[dict], total: int | None, now: float, waiting: bool, rate: float | None) -> Eta:
    """When the run reaches `total` steps.

    Running: from the latest `train` record, the steps left at `rate`. Waiting (pending in the
    queue, or stopped and not resumed yet): from the last stop, the mean of the past requeue
    waits (or now, if that is already past), then the steps left; with no past requeue to
    measure a wait by, only "after it starts".
    """
    end = next((r for r in reversed(records) if r.get("kind") in ("end", "train")), None)  # a later train: resumed
    if end is not None and end.get("kind") == "end" and end.get("status") == "finished":
        return Eta(0.0, end.get("time"), "finished")
    train = _timed(records, "train")
    if not train or rate is None:
        return Eta(None, None, "after it starts" if waiting else "after the first logged steps")
    if total is None:
        return Eta(None, None, "total steps unknown (no config.yaml in the run directory)")
    step = max([train[-1]["step"], *(r["step"] for r in _timed(records, "stop"))])
    left = max(0, total - step) / rate
    if waiting:
        waits = run_requeue_waits(records, rate)
        if not waits:
            return Eta(None, None, "after it starts (no earlier requeue to measure the queue wait by)")
        since = max(r["time"] for r in [*train[-1:], *_timed(records, "stop")[-1:]])  # stopped, or crashed
        wait = statistics.fmean(waits)
        at = max(now, since + wait) + left
        return Eta(
            at - now, at, f"counting the mean queue wait of its {len(waits)} earlier requeue(s), {duration(wait)}"
        )
    at = train[-1]["time"] + left
    return Eta(max(0.0, at - now), at)


def recent_straggler(records: list[dict]) -> dict | None:
    """The latest `straggler` record, when its step is within the last two log intervals."""
    strag = next((r for r in reversed(records) if r.get("kind") == "straggler"), None)
    if strag is None:
        return None
    steps = [r["step"] for r in _timed(records, "train")]
    return strag if len(steps) < 2 or strag.get("step", 0) >= steps[-2] else None


def duration(s: float | None) -> str:
    """Seconds as people read them: 45s, 3m05s, 2h07m, 3d04h."""
    if s is None:
        return "-"
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def iso(t: float | None) -> str | None:
    """A unix time as local ISO 8601 with its offset, to the second."""
    return None if t is None else datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def progress_line(records: list[dict], total: int | None, now: float, global_batch: int | None = None) -> str:
    """One line: step/total, epoch, loss, images/s, MFU when recorded, ETA; '' before the first step."""
    train = [r for r in records if r.get("kind") == "train"]
    if not train:
        return ""
    r = train[-1]
    parts = [f"step {r['step']}/{total} ({100 * r['step'] / total:.0f}%)" if total else f"step {r['step']}"]
    if r.get("epoch") is not None:
        parts.append(f"epoch {r['epoch']:.2f}")
    if r.get("loss") is not None:
        parts.append(f"loss {r['loss']:.4f}")
    if r.get("images_per_s") is not None:
        parts.append(f"{r['images_per_s']:.0f} img/s")
    if r.get("mfu") is not None:
        parts.append(f"MFU {100 * r['mfu']:.1f}%")
    e = eta(records, total, now, False, steps_per_s(records, global_batch))
    if e.seconds is not None and e.note != "finished":
        parts.append(f"ETA {duration(e.seconds)}")
    return " · ".join(parts)


RECHECK_S = 5.0  # how often a tail with nothing new looks at the path again (one stat)


class MetricsTail:
    """metrics.jsonl read as it grows, from one open of the file: new complete lines only. While
    nothing new comes, the path is looked at again (one stat) at most every `recheck_s`: for the file
    to appear, or for a replaced one, read from its start (a resumed run moves the records it will
    write again out: hpctrain.run.metrics.supersede). A follower of a days-long job costs the file
    system's metadata server one open and a stat every few seconds of silence, not an open a poll."""

    def __init__(self, path: Path, recheck_s: float = RECHECK_S, clock: Callable[[], float] = time.monotonic):
        self.path, self.records, self.recheck_s, self.clock = Path(path), [], recheck_s, clock
        self._f: BinaryIO | None = None
        self._ino: int | None = None
        self._partial = b""
        self._checked: float | None = None

    def poll(self) -> list[dict]:
        chunk = self._f.read() or b"" if self._f else b""
        if not chunk:
            now = self.clock()
            if self._checked is None or now - self._checked >= self.recheck_s:
                self._checked = now
                self._reopen_if_replaced()
                chunk = self._f.read() or b"" if self._f else b""
        data = self._partial + chunk
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next poll
        self._partial = data[end:]
        for line in data[:end].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                self.records.append(rec)
        return self.records

    def _reopen_if_replaced(self) -> None:
        try:
            st = os.stat(self.path)
        except OSError:
            return
        if self._f is not None and st.st_ino == self._ino and st.st_size >= self._f.tell():
            return
        self.close()
        try:
            self._f = open(self.path, "rb", buffering=0)  # noqa: SIM115 (held for the follower's life)
        except OSError:
            return
        self._ino, self.records, self._partial = os.fstat(self._f.fileno()).st_ino, [], b""

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def record_key(r: dict) -> tuple:
    """What tells one record from another: its kind, time and step."""
    return r.get("kind"), r.get("time"), r.get("step")


class Since:
    """The records of the job being watched: those after what the run's metrics.jsonl held when the
    watch began (`before`). A resumed run's file holds its earlier attempts' records, whose last step
    and ETA would show until the new attempt logs its first step. Appended records are new whatever
    their clock; when the tail reads a replaced file (metrics.supersede keeps the earlier records
    before the resumed step), the first record not seen at the start is searched for once."""

    def __init__(self, before: list[dict]) -> None:
        self.before = {record_key(r) for r in before}
        self.seen, self.start = before, len(before)

    def of(self, records: list[dict]) -> list[dict]:
        if records is not self.seen:  # the tail started a new list: the file appeared, or was replaced
            self.seen = records
            self.start = next((i for i, r in enumerate(records) if record_key(r) not in self.before), len(records))
        return records[self.start :]


def watch(
    run_dir: Path,
    done: Callable[[], bool],
    config: dict,
    out: TextIO | None = None,
    every_s: float = 10.0,
    poll_s: float = 1.0,
    global_batch: int | None = None,
    tail: MetricsTail | None = None,
) -> None:
    """Print the run's progress line until `done()`: rewritten in place on a terminal, else a plain
    line when the step moved and `every_s` has passed (CI logs keep a trace); a last one at the end.
    `out`: sys.stdout as it is at the call (a default bound at import would keep a replaced one).
    `tail`: the run's metrics as `done` reads them too (one reader of the file)."""
    out = sys.stdout if out is None else out
    tail = MetricsTail(Path(run_dir) / METRICS) if tail is None else tail
    tty = out.isatty()
    shown, shown_at = "", 0.0
    ours = Since(tail.poll())  # a resumed run's file holds its earlier attempts' records: not this job's
    while True:
        finished = done()
        records = tail.poll()
        line = progress_line(ours.of(records), total_steps(config, records), time.time(), global_batch)
        if line and tty:  # the ETA counts down between records too
            width = shutil.get_terminal_size().columns - 1
            out.write("\r" + line[:width].ljust(min(width, len(shown))))
            out.flush()
            shown = line
        elif (
            line
            and line.split(" · ")[0] != shown.split(" · ")[0]  # a new step, not only a new eval
            and (finished or time.monotonic() - shown_at >= every_s)
        ):
            out.write(line + "\n")
            out.flush()
            shown, shown_at = line, time.monotonic()
        if finished:
            if tty and shown:
                out.write("\n")
                out.flush()
            return
        time.sleep(poll_s)

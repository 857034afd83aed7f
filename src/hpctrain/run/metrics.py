"""Where results go: `metrics.jsonl` (one JSON object per line), progress, a summary table.

The file's format: the task writes it (train.loop), the login node reads it (watch.summary, sweep,
ckpt_cost, requeue, report), so it lives below both launch and train."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("hpctrain")
# Progress lines for the rank log files only: entry.setup_logging keeps them off the console,
# where Progress already prints them (rank 0).
progress_log = logging.getLogger("hpctrain.progress")


class MetricsWriter:
    """Appends JSON lines (rank 0 only); a requeued job appends to the same file, once the
    records it will write again are moved out (`supersede`).

    `sink` (optional, e.g. `tensorboard.TensorBoardSink`) sees every record written, and the
    records a resume keeps and moves (`restart(kept, moved)`); a sink that fails is dropped with
    one warning: it never stops the run.
    """

    def __init__(self, path: str | Path | None, sink: Any = None):
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self._f = self._open()
        self.failed = False
        self.sink = sink if self.path else None

    def _to_sink(self, method: str, *args: Any) -> None:
        if self.sink is None:
            return
        try:
            getattr(self.sink, method)(*args)
        except Exception as e:  # e.g. a full disk under the event files
            log.warning("%s failed (%s: %s); it gets no more records", type(self.sink).__name__, type(e).__name__, e)
            self.sink = None

    def _open(self):
        return open(self.path, "a", buffering=1) if self.path else None  # noqa: SIM115

    def supersede(self, replayed: Callable[[dict], bool]) -> int:
        """Move the records a resumed run will write again out of the file (see `supersede`)."""
        if not self.path:
            return 0
        recs = read_metrics(self.path) if self.sink else []
        self._close_file()
        try:
            return supersede(self.path, replayed)
        finally:
            self._f = self._open()
            if recs:
                moved = [r for r in recs if isinstance(r, dict) and replayed(r)]
                self._to_sink("restart", [r for r in recs if isinstance(r, dict) and not replayed(r)], moved)

    def write(self, kind: str, **fields: Any) -> None:
        if self._f:
            rec = json_safe({"kind": kind, "time": round(time.time(), 3), **fields})
            try:
                with self._lock:  # the hang watchdog's thread writes records too
                    self._f.write(json.dumps(rec, allow_nan=False) + "\n")
            except OSError as e:  # a full disk loses metric lines, not the run (checkpoints decide)
                if not self.failed:
                    log.warning("cannot append to %s: %s; metrics are lost until there is space", self.path, e)
                self.failed = True
            self._to_sink("record", rec)

    def close(self) -> None:
        self._close_file()
        self._to_sink("close")

    def _close_file(self) -> None:
        if self._f:
            with contextlib.suppress(OSError):
                self._f.close()
            self._f = None


NONFINITE_FIELDS = "nonfinite_fields"  # the record field that names the values written as null


def json_safe(rec: dict) -> dict:
    """`rec` with every non-finite float (inf, -inf, NaN; nested in dicts and lists too) as null,
    and, when there were any, `nonfinite_fields`: {field path: "inf" | "-inf" | "nan"} (nested paths
    joined by dots: `gpus.0.power_w`).

    Python's json writes these as the bare words Infinity/NaN, which are not JSON (RFC 8259 has no
    such numbers): strict readers (jq, JavaScript's JSON.parse, Go's encoding/json, pandas with
    engine=pyarrow) reject the whole file. fp16 steps the GradScaler skips have an infinite gradient
    norm, so a train record can carry one in a healthy run. Readers treat null as not measured.
    """
    flagged: dict[str, str] = {}

    def clean(v: Any, path: str) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            flagged[path] = "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
            return None
        if isinstance(v, dict):
            return {k: clean(x, f"{path}.{k}" if path else str(k)) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x, f"{path}.{i}") for i, x in enumerate(v)]
        return v

    out = clean(rec, "")
    if flagged:
        out[NONFINITE_FIELDS] = flagged
    return out


def superseded_path(path: Path) -> Path:
    return path.with_name(f"{path.stem}.superseded{path.suffix}")


def _write_synced(path: Path, lines: list[str], mode: str) -> None:
    with open(path, mode) as f:
        f.writelines(line + "\n" for line in lines)
        f.flush()
        os.fsync(f.fileno())


def supersede(path: Path, replayed: Callable[[dict], bool]) -> int:
    """Move records for which `replayed(rec)` holds, and lines cut by a crash, to
    <stem>.superseded.jsonl; returns how many lines moved.

    A run resuming from step k replays what an earlier attempt logged past k: without this,
    metrics.jsonl would hold two timelines. Appending to the superseded file (synced) comes before
    replacing metrics.jsonl (temp file, fsync, rename), so a crash in between duplicates lines,
    never loses them. Dropping cut lines also keeps the next record off a line with no newline.
    """
    if not path.is_file():
        return 0
    keep, moved = [], []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            rec = None
        (moved if not isinstance(rec, dict) or replayed(rec) else keep).append(line)
    if not moved:
        return 0
    _write_synced(superseded_path(path), moved, "a")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _write_synced(tmp, keep, "w")
    os.replace(tmp, path)
    return len(moved)


def read_metrics(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a crash
    return out


class Progress:
    """One updating line on a terminal (when `enabled`: rank 0); plain lines in logs.

    Every rank also writes each line to its log file (`progress_log`): a rank that is slow or
    stuck shows in its own log, not only in rank 0's console.
    """

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled
        self.tty = enabled and sys.stdout.isatty()

    def update(self, step: int, text: str) -> None:
        line = f"step {step}/{self.total} ({100 * step / max(1, self.total):.0f}%) {text}"
        progress_log.info(line)
        if not self.enabled:
            return
        if self.tty:
            sys.stdout.write("\r" + line[:160].ljust(100))
            sys.stdout.flush()
        else:
            print(line, flush=True)

    def newline(self) -> None:
        if self.tty:
            sys.stdout.write("\n")


def table(rows: list[tuple[str, str]], title: str = "") -> str:
    w = max(len(k) for k, _ in rows)
    lines = [title] if title else []
    lines += [f"  {k.ljust(w)}  {v}" for k, v in rows]
    return "\n".join(lines)


def fmt_pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} %"


def summary_table(s: dict[str, Any]) -> str:
    """A training run's summary (train.entry.run's): rank 0 logs it, a local `hpctrain submit` prints it."""
    rows = [
        ("status", s["status"]),
        ("run directory", s["run_dir"]),
        ("steps", f"{s['step']}/{s['total_steps']} (epoch {s['epoch']})"),
        ("val top-1", fmt_pct(s["top1"])),
        ("val top-5", fmt_pct(s["top5"])),
        ("val images", str(s["val_count"] or "-")),
        ("final train loss", f"{s['train_loss']:.4f}"),
        ("throughput", f"{s['images_per_s']:.0f} images/s"),
        ("data wait", f"{100 * s['data_wait']:.1f} %"),
        ("wall time", f"{s['wall_s']:.1f} s"),
        ("world size", str(s["world_size"])),
    ]
    if s.get("ema_top1") is not None:
        rows.insert(5, ("EMA val top-1", fmt_pct(s["ema_top1"])))
    if s.get("resumed_from") is not None:
        rows.append(("resumed from step", str(s["resumed_from"])))
    return table(rows, "hpctrain summary")


def eval_summary_table(s: dict[str, Any]) -> str:
    """What `hpctrain eval` prints: the summary that rank 0 writes to summary.json (train.evaluate)."""
    rows = [
        ("weights", s["weights"] + (" (EMA)" if s["ema"] else "")),
        ("split", f"{s['split']} of {s['data_root']}"),
        ("input", f"{s['img_size']}px, crop_pct {s['crop_pct']:g}, {s['interpolation']}"),
        ("top-1", f"{s['top1']:.4f} %"),
        ("top-5", f"{s['top5']:.4f} %"),
        ("loss", f"{s['loss']:.6f}"),
        ("images", str(s["count"])),
        ("world size", str(s["world_size"])),
    ]
    rows += [
        (f"confused #{i + 1}", f"{p['true']} → {p['predicted']}: {p['count']}")
        for i, p in enumerate(s["most_confused"])
    ]
    if s.get("per_class_csv"):
        rows.append(("per-class accuracy", s["per_class_csv"]))
    return table(rows, "hpctrain eval")


def steps_per_epoch(records: list[dict]) -> int | None:
    """From any `train` record past the first epoch's start: `epoch` is step / steps per epoch."""
    for r in reversed(records):
        if r.get("kind") == "train" and r.get("epoch") and r.get("step"):
            return round(r["step"] / r["epoch"])
    return None


def total_steps(config: dict, records: list[dict]) -> int | None:
    """The run's last step, as the Trainer sets it: `train.max_steps`, else epochs × steps per epoch."""
    train = config.get("train") or {}
    if train.get("max_steps"):
        return int(train["max_steps"])
    spe = steps_per_epoch(records)
    return int(train["epochs"]) * spe if spe and train.get("epochs") else None

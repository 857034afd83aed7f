"""TensorBoard event files in `<run>/tb/`, written from the records metrics.jsonl gets (rank 0).

The sink sees each record `MetricsWriter` writes, so TensorBoard and metrics.jsonl hold the same
numbers at the same steps (global_step = the record's step, wall time = its `time`) and the loop
needs no second logging call. Tags: `train/<field>` and `eval/<field>` for every numeric field,
`gpu<i>/<field>` for the per-GPU entries of a train record.

Requeues: a run resumed at step s replays what an earlier attempt logged past s, so that
attempt's event file may hold points the new attempt writes again. When `MetricsWriter.supersede`
moves such records out of metrics.jsonl, the new event file starts with a purge marker at the
first replayed step p (`SummaryWriter(purge_step=p)`: a `SessionLog.START` event at step p, on
which TensorBoard's Python loader drops every earlier point with step ≥ p, all tags), then
re-writes the kept records at steps ≥ p (the train point at s when the eval at s is replayed).
TensorBoard's Rust data server (`--load_fast`) ignores SessionLog and instead drops, per tag, the
points at steps ≥ any step written again, which the replay gives it too. Sources in
docs/observability.md.
"""

from __future__ import annotations

import logging
import numbers
from pathlib import Path
from typing import Any

log = logging.getLogger("hpctrain")

KINDS = ("train", "eval", "goodput")  # record kinds whose numbers become scalars (goodput: one per attempt)
AXES = frozenset({"step", "time", "epoch"})  # the x axes, not curves
FLUSH_ON = frozenset({"checkpoint", "stop", "end"})  # everything up to a checkpoint is on disk with it


def _number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def scalars(rec: dict) -> dict[str, float]:
    """Tag → value for every numeric field of a `train` or `eval` record (none for other kinds)."""
    kind = rec.get("kind")
    if kind not in KINDS:
        return {}
    out = {f"{kind}/{k}": float(v) for k, v in rec.items() if k not in AXES and _number(v)}
    for g in rec.get("gpus") or ():
        if isinstance(g, dict) and _number(g.get("index")):
            out.update({f"gpu{int(g['index'])}/{k}": float(v) for k, v in g.items() if k != "index" and _number(v)})
    return out


class TensorBoardSink:
    """Writes records as scalars; the event file is created on first use (none for a run that logs
    nothing), with a purge marker when `restart` says an earlier attempt logged past this one."""

    def __init__(self, log_dir: Path, writer_cls):
        self.log_dir, self._cls, self._w = Path(log_dir), writer_cls, None

    def _writer(self, purge_step: int | None = None):
        if self._w is None:
            self._w = self._cls(log_dir=str(self.log_dir), purge_step=purge_step, flush_secs=30)
            hold_open(self._w)
        return self._w

    def restart(self, kept: list[dict], moved: list[dict]) -> None:
        """A resumed run moved `moved` out of metrics.jsonl and will log those steps again."""
        steps = [r["step"] for r in moved if _number(r.get("step"))]
        if not steps:
            return  # no earlier attempt logged ahead of this one
        purge = int(min(steps))
        self._writer(purge)
        for rec in kept:
            if _number(rec.get("step")) and rec["step"] >= purge:
                self.record(rec)

    def record(self, rec: dict) -> None:
        values = scalars(rec)
        if values:
            w = self._writer()
            for tag, v in values.items():
                w.add_scalar(tag, v, global_step=int(rec["step"]), walltime=rec.get("time"))
        if rec.get("kind") in FLUSH_ON and self._w is not None:
            self._w.flush()

    def close(self) -> None:
        if self._w is not None:
            self._w.close()
            self._w = None


def hold_open(writer: Any) -> bool:
    """Keep the event file open for the run. Without TensorFlow, tensorboard writes through its stub
    gfile, which opens, appends to and closes the file for every event: one open per scalar, 6–11 a
    second on rank 0 at log.every=10 (bench/site_load.py), each a request to a parallel file system's
    metadata server. Right after the writer is made (its first events flushed, its queue empty), the
    record writer's stub file is swapped for one Python file opened once in append mode, which the
    writer's `close` closes. False, and nothing changed, where the writer is not that stack (real
    TensorFlow's gfile keeps its file open already; another tensorboard whose internals differ)."""
    try:
        events = writer._get_file_writer().event_writer  # torch FileWriter → tensorboard EventFileWriter
        records, name = events._async_writer._writer, events._file_name  # its RecordWriter and file
        stub = records._writer
    except AttributeError:
        return False
    if not type(stub).__module__.startswith("tensorboard.compat.tensorflow_stub"):
        return False
    events.flush()
    records._writer = open(name, "ab")  # noqa: SIM115 (closed by the writer's close)
    return True


def open_sink(run_dir: Path | None) -> TensorBoardSink | None:
    """The sink for rank 0 of a run with a directory, or None (no directory, or tensorboard missing:
    the run trains on without it, after one warning)."""
    if run_dir is None:
        return None
    try:
        # tensorboard: an optional package (without it: one warning), 0.3 s to import, rank 0 only
        from torch.utils.tensorboard import SummaryWriter
    except Exception as e:  # ImportError without the package; a broken install raises others
        log.warning(
            "no TensorBoard logging (%s: %s): pip install tensorboard, or leave tensorboard out of log.trackers",
            type(e).__name__,
            e,
        )
        return None
    return TensorBoardSink(Path(run_dir) / "tb", SummaryWriter)

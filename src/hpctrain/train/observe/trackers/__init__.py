"""Experiment trackers (`log.trackers`): sinks of `MetricsWriter`, fed the records metrics.jsonl gets.

Every tracker sees what metrics.jsonl holds, at the same steps, from one place (rank 0's
`MetricsWriter`), so the loop has no second logging call. One tracker run per hpctrain run across
every requeue: its identity is derived from the run directory (`run_key`), a resumed attempt
continues it, and each tracker skips the steps an earlier attempt already logged (the replay after
a resume): TensorBoard by its purge marker (`tensorboard.py`), MLflow and W&B by reading the last
logged step back from their own files (`mlflow_sink.py`, `wandb_sink.py`; facts and sources in
docs/trackers.md).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError
from hpctrain.run.layout import ENV
from hpctrain.train.observe import tensorboard

log = logging.getLogger("hpctrain")

PACKAGES = {"mlflow": "mlflow", "wandb": "wandb"}  # tracker → module it needs (the `trackers` extra)
FLUSH_ON = tensorboard.FLUSH_ON


class TrackerMissing(UserError):
    """A tracker listed in log.trackers whose package is not installed where the run trains."""


def run_key(run_dir: Path) -> str:
    """The tracker run's identity: the same for every attempt of one run directory (its resolved
    path), different for two runs. 16 hex digits: a valid W&B run id and MLflow tag value."""
    return hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def check_packages(names: tuple[str, ...]) -> None:
    """Refuse to start when a chosen tracker's package is missing (before training, on every rank:
    a run that silently logged nowhere would be found out only after it ended)."""
    for name in names:
        pkg = PACKAGES.get(name)
        if pkg and importlib.util.find_spec(pkg) is None:
            raise TrackerMissing(
                f"log.trackers lists {name} but the {pkg} package is not installed here: "
                f"pip install 'hpctrain[trackers]' (in the image), or remove {name} from "
                "log.trackers"
            )


def flat(d: Any, prefix: str = "") -> dict[str, str]:
    """Nested config/env values as `a.b.c` → text (tracker params and tags are flat strings)."""
    if isinstance(d, dict):
        out: dict[str, str] = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d if isinstance(d, str) else json.dumps(d)}


def read_env(run_dir: Path) -> dict:
    """This attempt's env.json (entry writes it before the trainer starts); {} if absent."""
    try:
        return json.loads((Path(run_dir) / ENV).read_text())
    except (OSError, ValueError):
        return {}


class Fanout:
    """One `MetricsWriter` sink over several trackers; one that fails is dropped alone, with one
    warning, and the others (and the run) go on."""

    def __init__(self, sinks: list):
        self.sinks = list(sinks)

    def _each(self, method: str, *args: Any) -> None:
        for s in list(self.sinks):
            try:
                getattr(s, method)(*args)
            except Exception as e:  # a tracker's disk or service: never the run's end
                log.warning("%s failed (%s: %s); it gets no more records", type(s).__name__, type(e).__name__, e)
                self.sinks.remove(s)

    def restart(self, kept: list[dict], moved: list[dict]) -> None:
        self._each("restart", kept, moved)

    def record(self, rec: dict) -> None:
        self._each("record", rec)

    def close(self) -> None:
        self._each("close")


def _open(name: str, cfg, run_dir: Path):
    if name == "mlflow":
        # heavy optional package (~1.5 s import): only when chosen
        from hpctrain.train.observe.trackers import mlflow_sink

        return mlflow_sink.MLflowSink.open(cfg, run_dir)
    # heavy optional package (a service process): only when chosen
    from hpctrain.train.observe.trackers import wandb_sink

    return wandb_sink.WandbSink.open(cfg, run_dir)


def open_sink(cfg, run_dir: Path | None) -> Fanout | None:
    """The trackers of `cfg.log.trackers` for rank 0 of a run with a directory, or None."""
    if run_dir is None:
        return None
    sinks = []
    if "tensorboard" in cfg.log.trackers:
        tb = tensorboard.open_sink(run_dir)
        if tb is not None:
            sinks.append(tb)
    for name in ("mlflow", "wandb"):
        if name in cfg.log.trackers:
            try:
                sinks.append(_open(name, cfg, Path(run_dir)))
            except Exception as e:  # an unreachable server, a store it cannot write: the run trains on
                log.warning("no %s tracking (%s: %s); the run goes on without it", name, type(e).__name__, e)
    return Fanout(sinks) if sinks else None

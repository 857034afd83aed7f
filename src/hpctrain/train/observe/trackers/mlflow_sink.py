"""MLflow: one MLflow run per hpctrain run, in `<run>/mlruns` (a file store) or `log.mlflow_uri`.

MLflow picks run ids itself (`create_run` takes none), so the run is found again by its tag
`hpctrain.run_key` (`trackers.run_key`, from the run directory). A metric's history is append-only
(`log_metric`/`log_batch` add a point per call, two at one step are both kept, and no client call
deletes one), so replayed steps are skipped, never logged again: at start the sink reads each
metric's last logged step back from the store (`get_metric_history`) and then logs only later
steps, per metric. After a crash the replayed steps keep the first attempt's values (those moved to
metrics.superseded.jsonl); after a clean stop nothing is replayed. Sources in docs/trackers.md.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

# Heavy optional package (the `trackers` extra): this module is imported only when log.trackers
# lists mlflow (trackers.open_sink) or a report reads a store (hpctrain.watch.report).
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from hpctrain.config import to_dict
from hpctrain.train.observe.tensorboard import KINDS, scalars
from hpctrain.train.observe.trackers import flat, read_env, run_key

KEY_TAG = "hpctrain.run_key"
BATCH = 100  # log_batch takes at most 100 params / 1000 metrics per call


def store_uri(uri: str, run_dir: Path) -> str:
    """The tracking URI: `log.mlflow_uri`, or the file store `<run>/mlruns`. MLflow ≥ 3.7 refuses
    a file store unless MLFLOW_ALLOW_FILE_STORE=true ("maintenance mode"); it is the only store that
    works on a file system without POSIX locks (sqlite needs them), so it is allowed here."""
    if not uri or uri.startswith("file:") or "://" not in uri:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return uri or (Path(run_dir) / "mlruns").resolve().as_uri()


def find_run(client: MlflowClient, experiment: str, key: str):
    """The MLflow run of this hpctrain run (None: not created yet)."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None
    found = client.search_runs([exp.experiment_id], filter_string=f"tags.`{KEY_TAG}` = '{key}'", max_results=1)
    return found[0] if found else None


def last_steps(client: MlflowClient, run) -> dict[str, int]:
    """Metric → the highest step the store holds for it."""
    return {k: max(m.step for m in client.get_metric_history(run.info.run_id, k)) for k in run.data.metrics}


class MLflowSink:
    def __init__(self, client: MlflowClient, run_id: str, last: dict[str, int]):
        self.client, self.run_id, self.last = client, run_id, last

    @classmethod
    def open(cls, cfg, run_dir: Path) -> MLflowSink:
        """Continue this run's MLflow run, or create it with the config and resolved values as params;
        every attempt's env.json goes in as tags (they may change between attempts: tags are mutable,
        params are not)."""
        client = MlflowClient(tracking_uri=store_uri(cfg.log.mlflow_uri, run_dir))
        key = run_key(run_dir)
        run = find_run(client, cfg.log.mlflow_experiment, key)
        env = read_env(run_dir)
        if run is None:
            exp = client.get_experiment_by_name(cfg.log.mlflow_experiment)
            eid = exp.experiment_id if exp else client.create_experiment(cfg.log.mlflow_experiment)
            run = client.create_run(eid, run_name=cfg.run.name, tags={KEY_TAG: key, "hpctrain.run_dir": str(run_dir)})
            params = {**flat(to_dict(cfg)), **flat(env.get("resolved", {}), "resolved.")}
            items = [Param(k, v[:6000]) for k, v in sorted(params.items())]
            for i in range(0, len(items), BATCH):
                client.log_batch(run.info.run_id, params=items[i : i + BATCH])
            last: dict[str, int] = {}
        else:
            client.update_run(run.info.run_id, status="RUNNING")
            last = last_steps(client, run)
        env_tags = flat({k: v for k, v in env.items() if k != "resolved"}, "env.")
        tags = [RunTag(re.sub(r"[^\w\-. /]", "_", k), v[:5000]) for k, v in sorted(env_tags.items())]
        for i in range(0, len(tags), BATCH):
            client.log_batch(run.info.run_id, tags=tags[i : i + BATCH])
        return cls(client, run.info.run_id, last)

    def restart(self, kept: list[dict], moved: list[dict]) -> None:
        """A resume: log what metrics.jsonl keeps that the store lacks (none, unless mlflow was added
        to log.trackers on this resume); the replayed steps come again through `record`."""
        for rec in kept:
            if rec.get("kind") in KINDS:  # a kept stop or end record is history, not this attempt's state
                self.record(rec)

    def record(self, rec: dict) -> None:
        step = rec.get("step")
        ms = int(round(float(rec.get("time") or time.time()) * 1000))
        new = [Metric(k, v, ms, int(step)) for k, v in scalars(rec).items() if int(step) > self.last.get(k, -1)]
        if new:
            for i in range(0, len(new), 1000):
                self.client.log_batch(self.run_id, metrics=new[i : i + 1000])
            self.last.update({m.key: m.step for m in new})
        kind = rec.get("kind")
        if kind == "end":
            summary = {
                f"summary.{k}": str(rec[k])
                for k in ("status", "step", "wall_s", "top1", "top5")
                if rec.get(k) is not None
            }
            self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in summary.items()])
            self.client.set_terminated(self.run_id, "FINISHED")
        elif kind == "stop":
            self.client.set_tag(self.run_id, "summary.status", str(rec.get("reason")))
            self.client.set_terminated(self.run_id, "KILLED")  # a requeue sets it RUNNING again (open)

    def close(self) -> None:
        """Nothing buffered: the file store writes each call through."""

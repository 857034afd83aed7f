"""metrics.jsonl is strict JSON: a non-finite number is written as null, named in nonfinite_fields,
and the readers (status, report, TensorBoard/trackers) take the null as "not measured"."""

from __future__ import annotations

import json
import math

import torch

from hpctrain.config import load
from hpctrain.data.synthetic import SyntheticLoader
from hpctrain.models.vit import build_vit
from hpctrain.run.metrics import MetricsWriter, read_metrics
from hpctrain.train.dist import DistInfo
from hpctrain.train.loop import build_trainer
from hpctrain.train.observe.tensorboard import scalars
from hpctrain.watch import report
from hpctrain.watch.render import status_text
from hpctrain.watch.summary import run_status, summarize
from tests.helpers import DIGITS


def strict_lines(path) -> list[dict]:
    """Each line parsed as RFC 8259 JSON: the bare words Infinity and NaN (Python's default) refused,
    as jq, JSON.parse and Go's encoding/json refuse them."""

    def refuse(word):
        raise ValueError(f"{word} is not JSON")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def test_nonfinite_numbers_are_written_as_null_and_named(tmp_path):
    w = MetricsWriter(tmp_path / "metrics.jsonl")
    w.write("train", step=2, loss=2.5, grad_norm=math.inf, gpus=[{"index": 0, "power_w": math.nan}])
    w.write("nonfinite", step=3, reason="nonfinite", loss=-math.inf)
    w.write("train", step=4, loss=2.25, grad_norm=0.5)
    w.close()
    a, b, c = strict_lines(tmp_path / "metrics.jsonl")
    assert a["grad_norm"] is None and a["gpus"] == [{"index": 0, "power_w": None}] and a["loss"] == 2.5
    assert a["nonfinite_fields"] == {"grad_norm": "inf", "gpus.0.power_w": "nan"}
    assert b["loss"] is None and b["nonfinite_fields"] == {"loss": "-inf"}
    assert "nonfinite_fields" not in c and c["grad_norm"] == 0.5


def test_fp16_skipped_steps_write_strict_json(tmp_path):
    """The GradScaler skips steps whose fp16 gradients overflow (here: its first scale, 2^30, overflows
    fp16 for every step run): their gradient norm is not finite, and the train records stay JSON."""
    cfg = load(
        DIGITS,
        [
            "data.loader=synthetic",
            "data.global_batch=16",
            "train.max_steps=4",
            "train.amp=fp16",
            "model.depth=1",
            "log.every=2",
            "train.eval_every_epochs=0",
            "ckpt.every=0",
        ],
    )
    loader = SyntheticLoader(
        train=True,
        batch_size=16,
        world=1,
        rank=0,
        size=64,
        img_size=cfg.model.img_size,
        num_classes=cfg.model.num_classes,
        seed=0,
        device=torch.device("cpu"),
    )
    torch.manual_seed(0)
    tr = build_trainer(cfg, DistInfo(), torch.device("cpu"), tmp_path, loader, None, build_vit(cfg.model))
    tr.scaler._init_scale = 2.0**30  # the real scaler, started where fp16 gradients overflow
    tr.run()
    trains = [r for r in strict_lines(tmp_path / "metrics.jsonl") if r["kind"] == "train"]
    assert len(trains) == 2
    assert all(r["grad_norm"] is None and r["nonfinite_fields"]["grad_norm"] in ("inf", "nan") for r in trains)
    assert all(math.isfinite(r["loss"]) for r in trains)  # the loss itself is fine: only the steps were skipped


def test_readers_take_null_as_not_measured(tmp_path):
    w = MetricsWriter(tmp_path / "metrics.jsonl")
    w.write("train", step=2, epoch=0.5, loss=math.nan, grad_norm=math.inf, images_per_s=100.0)
    w.write("nonfinite", step=2, reason="nonfinite", loss=math.nan)
    w.close()
    recs = read_metrics(tmp_path / "metrics.jsonl")
    m = summarize(recs)
    assert m["step"] == 2 and m["loss"] is None and m["loss_nonfinite"] == "nan"
    assert m["last_nonfinite"]["loss"] is None
    json.dumps(m, allow_nan=False)  # `hpctrain status --json` stays JSON too
    assert "train loss     nan (not finite)" in status_text(run_status(str(tmp_path)))
    assert scalars(recs[0]) == {"train/images_per_s": 100.0}  # TensorBoard, W&B, MLflow: no point, no error
    run = report.load_run(tmp_path)
    assert dict(report.summary(run))["final train loss"] == "–"

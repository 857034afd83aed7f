"""MLflow and W&B (offline) on a real digits run stopped at step k and resumed: one tracker run,
each step once, the values of metrics.jsonl, read back with the trackers' own readers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from hpctrain.cli import main
from hpctrain.config import ConfigError, load
from hpctrain.run.metrics import read_metrics
from hpctrain.train.observe.tensorboard import scalars
from hpctrain.train.observe.trackers import TrackerMissing, run_key, wandb_file
from hpctrain.watch import report
from tests.helpers import halt_at

mlflow = pytest.importorskip("mlflow", reason="the trackers extra (pip install 'hpctrain[trackers]')")
pytest.importorskip("wandb", reason="the trackers extra (pip install 'hpctrain[trackers]')")

HALT, STEPS = 5, 7  # stop at step 5, resume from the checkpoint at 4 (5 replayed), to 7; eval at the end
SETS = [
    "train.threads=1",
    "ckpt.every=2",
    "ckpt.keep=5",
    "log.every=1",
    "train.eval_every_epochs=0",
    f"train.max_steps={STEPS}",
    "log.trackers=[mlflow,wandb]",
]


@pytest.fixture(scope="module")
def run_dir(digits_root, tmp_path_factory):
    """Trained in this process (a subprocess costs ~7 s of CPU to start): halted at step HALT, its
    checkpoint there deleted (as if the job had died after logging step HALT, before saving it), resumed
    from step HALT - 1: step HALT is trained and logged again."""
    from hpctrain.train.ckpt import checkpoint as ckpt
    from hpctrain.train.entry import run

    d = tmp_path_factory.mktemp("trackers")

    def train(*sets: str) -> dict:
        return run(
            load(
                "digits_vit",
                [f"data.root={digits_root}", "data.prepare=none", f"run.dir={d}", "run.name=tr", *SETS, *sets],
            )
        )

    with halt_at(HALT):
        assert train()["status"] == "halted"
    newest, older = ckpt.list_checkpoints(d / "tr")[:2]
    assert ckpt.step_of(newest) == HALT
    shutil.rmtree(newest) if newest.is_dir() else newest.unlink()
    ckpt.point_latest(newest.parent, older)
    out = train()
    assert out["resumed_from"] == HALT - 1 and out["status"] == "finished"
    return d / "tr"


def expected(run_dir) -> dict[str, list[tuple[int, float]]]:
    """Metric → [(step, value)] as the trackers must hold it: metrics.jsonl's, except at the replayed
    step, which keeps the first attempt's values (moved to metrics.superseded.jsonl): the trackers
    append only, so they skip a step they logged already, and keep what they logged."""
    first = {(r["kind"], r["step"]): r for r in read_metrics(run_dir / "metrics.superseded.jsonl")}
    assert ("train", HALT) in first, "the resume replayed step HALT"
    out: dict[str, list[tuple[int, float]]] = {}
    kept = read_metrics(run_dir / "metrics.jsonl")
    for rec in kept:
        for k, v in scalars(first.get((rec.get("kind"), rec.get("step")), rec)).items():
            out.setdefault(k, []).append((rec["step"], v))
    # a moved record that nothing logged again stays where the trackers put it: the halted attempt's
    # `goodput` record at step HALT (the resumed attempt's is at its end)
    again = {(r.get("kind"), r.get("step")) for r in kept}
    for key, rec in first.items():
        if key not in again:
            for k, v in scalars(rec).items():
                out.setdefault(k, []).append((rec["step"], v))
    return {k: sorted(v) for k, v in out.items()}


@pytest.mark.slow
def test_mlflow_history_has_each_step_once_with_the_values_of_metrics_jsonl(run_dir):
    client = mlflow.tracking.MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    exp = client.get_experiment_by_name("hpctrain")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1, "one MLflow run across the stop and the resume"
    r = runs[0]
    assert r.data.tags["hpctrain.run_key"] == run_key(run_dir) and r.info.status == "FINISHED"
    want = expected(run_dir)
    assert [s for s, _ in want["train/loss"]] == list(range(1, STEPS + 1))
    assert "eval/top1" in want
    got = {k: [(m.step, m.value) for m in client.get_metric_history(r.info.run_id, k)] for k in want}
    assert got == want
    assert set(r.data.metrics) == set(want)
    env = json.loads((run_dir / "env.json").read_text())
    assert r.data.params["optim.lr"] == json.dumps(load(run_dir / "config.yaml").optim.lr)
    assert r.data.params["resolved.peak_lr"] == json.dumps(env["resolved"]["peak_lr"])
    assert r.data.tags["env.host"] == env["host"] and r.data.tags["env.hpctrain"] == env["hpctrain"]
    assert r.data.tags["summary.status"] == "finished" and r.data.tags["summary.step"] == str(STEPS)


@pytest.mark.slow
def test_wandb_offline_files_have_each_step_once_with_the_values_of_metrics_jsonl(run_dir):
    """Read with wandb's own protobuf classes (wandb 0.31 ships no Python reader of the framing)."""
    key = run_key(run_dir)
    logs = sorted((run_dir / "wandb").glob(f"offline-run-*-{key}/run-{key}.wandb"))
    assert len(logs) == 2, "one offline directory per attempt, one run id"
    got: dict[str, list[tuple[int, float]]] = {}
    config, summary = {}, {}
    for f in logs:
        for rec in wandb_file.records(f):
            if rec.WhichOneof("record_type") == "run":
                assert rec.run.run_id == key
                config = {i.key: json.loads(i.value_json) for i in rec.run.config.update}
            if rec.WhichOneof("record_type") == "summary":
                summary.update({i.key: json.loads(i.value_json) for i in rec.summary.update if i.key})
            if rec.WhichOneof("record_type") != "history":
                continue
            for item in rec.history.item:
                name = item.key or "/".join(item.nested_key)
                if not name.startswith("_"):
                    got.setdefault(name, []).append((rec.history.step.num, json.loads(item.value_json)))
    assert got == expected(run_dir)
    env = json.loads((run_dir / "env.json").read_text())
    assert config["optim"]["lr"] == load(run_dir / "config.yaml").optim.lr
    assert config["resolved"] == env["resolved"] and config["env"]["host"] == env["host"]
    assert summary["status"] == "finished" and summary["step"] == STEPS


@pytest.mark.slow
def test_report_from_the_mlflow_store_draws_the_data_of_metrics_jsonl(run_dir):
    """The same points on the step axis; at the replayed step the loss of either attempt (equal: the
    same seed and batches), the throughput of the first (MLflow's)."""
    a, b = report.load_run(run_dir), report.load_run(run_dir, source="mlflow")
    drawn = 0
    for panel in report.PANELS:
        for s in panel.series:
            pa, pb = report._points(a, s, "step", 1.0), report._points(b, s, "step", 1.0)
            assert pa[0] == pb[0], s.key
            want = dict(expected(run_dir).get(f"{s.kind}/{s.key}", []))
            assert pb[1] == [want[x] * s.scale for x in pb[0]], s.key
            drawn += bool(pa[0])
    loss = report.PANELS[0].series[0]
    assert report._points(a, loss, "step", 1.0) == report._points(b, loss, "step", 1.0)
    assert drawn >= 5
    png = run_dir.parent / "mlflow.png"
    assert main(["report", str(run_dir), "--source", "mlflow", "-o", str(png)]) == 0 and png.stat().st_size
    assert len(report.figure([b], "step").axes) >= len(report.PANELS)


@pytest.mark.slow
def test_sync_uploads_every_attempt_into_one_wandb_run_without_torch(run_dir):
    code = (
        "import sys; from hpctrain.cli import main; rc = main(['sync', sys.argv[1], '--dry-run']); "
        "assert not {'torch', 'numpy'} & set(sys.modules), 'heavy import'; sys.exit(rc)"
    )
    r = subprocess.run([sys.executable, "-c", code, str(run_dir)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    line, ml = r.stdout.splitlines()
    key = run_key(run_dir)
    assert line.startswith(f"wandb sync --id {key} --project hpctrain ")
    assert len(line.split()[6:]) == 2 and all("offline-run-" in p for p in line.split()[6:])
    assert ml.startswith(f"MLflow: {run_dir / 'mlruns'} is a file store")


def test_unknown_tracker_is_one_line_naming_the_allowed_ones():
    with pytest.raises(
        ConfigError,
        match=r"log.trackers: unknown tracker 'neptune'; allowed: tensorboard, "
        r"mlflow, wandb$",
    ):
        load("digits_vit", ["log.trackers=[mlflow,neptune]"])


def test_missing_tracker_package_is_one_line_before_training(digits_root, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # what an uninstalled package looks like to find_spec
    rc = main(
        [
            "train",
            "--config",
            "digits_vit",
            "--set",
            f"data.root={digits_root}",
            "--set",
            f"run.dir={tmp_path}",
            "--set",
            "log.trackers=[wandb]",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and err.splitlines() == [
        "hpctrain: error: log.trackers lists wandb but the wandb package is not installed here: pip install "
        "'hpctrain[trackers]' (in the image), or remove wandb from log.trackers"
    ]
    assert not (tmp_path / "run").exists(), "refused before the run directory was made"
    assert TrackerMissing.__mro__[1].__name__ == "UserError"

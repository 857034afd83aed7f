"""The goodput ledger (run/goodput.py) of real runs: 4 local gloo ranks (2 per "node") that halt at a
step and resume, and a run whose tail a later attempt trained again (lost progress)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpctrain.run import goodput
from hpctrain.run.layout import METRICS
from hpctrain.run.metrics import superseded_path
from hpctrain.train.observe.tensorboard import scalars
from tests.helpers import digits_args, run_ranks

pytestmark = pytest.mark.slow  # trains 4-rank runs
SETS = ("train.epochs=2", "log.every=2", "ckpt.every=6", "train.eval_every_epochs=1")
NODES = [{"SLURMD_NODENAME": f"n{r // 2}", "LOCAL_RANK": str(r % 2)} for r in range(4)]


@pytest.fixture(scope="module")
def halted(digits_root, tmp_path_factory):
    """A 4-rank run halted at step 13 (a stop with a checkpoint) and resumed to its end."""
    base = tmp_path_factory.mktemp("goodput")
    run_ranks(4, digits_args(digits_root, base, "g", *SETS, "--halt-at=13"), rank_env=NODES)
    run_ranks(4, digits_args(digits_root, base, "g", *SETS), rank_env=NODES)
    return base / "g"


def test_a_halted_and_resumed_runs_categories_add_up_to_its_wall_time(halted):
    led = goodput.build(goodput.run_records(halted))
    assert [a["step"] for a in led.attempts] == [0, 13]  # two processes: the second resumed at the halt
    assert abs(led.sum_s - led.wall_s) <= 0.01 * led.wall_s, goodput.table(led)
    for c in ("startup", "productive", "checkpoint", "eval"):
        assert led.total(c) > 0, (c, goodput.table(led))
    assert set(led.parts["startup"]) >= {"imports", "process_group", "model", "checkpoint", "first_batch"}
    assert led.total("lost") == 0  # the halt saved at its step: nothing trained twice
    # the gap between the two processes (no Slurm: nothing restarted them) is the restart's
    assert led.total("restart") > 0 and led.ratios()["goodput"] == pytest.approx(led.total("productive") / led.wall_s)


def test_windows_a_later_attempt_trained_again_are_lost_progress(halted, tmp_path):
    """As if the second attempt had resumed from step 6 (the halt's checkpoint lost): the first
    attempt's windows of steps 7-12 are moved to metrics.superseded.jsonl and counted as lost, not productive."""
    recs = goodput.run_records(halted)
    before = goodput.build(recs)
    second = next(r["time"] for r in recs if r["kind"] == "startup" and r["step"] == 13)
    moved = [r for r in recs if r["kind"] == "train" and r["step"] in (8, 10, 12) and r["time"] < second]
    run = tmp_path / "g"
    run.mkdir()
    kept = [r for r in recs if r not in moved and not r.get("superseded")]
    (run / METRICS).write_text("".join(json.dumps(r) + "\n" for r in kept))
    superseded_path(run / METRICS).write_text("".join(json.dumps(r) + "\n" for r in moved))
    after = goodput.build(goodput.run_records(run))
    assert len(moved) == 3
    lost = sum(r["window_s"] - r["ckpt_s"] - r["eval_s"] for r in moved)
    assert after.total("lost") == pytest.approx(lost, abs=1e-3) and lost > 0
    assert after.total("productive") < before.total("productive")
    assert after.sum_s == pytest.approx(before.sum_s, rel=0.01)  # moved between categories, not lost from the sum


def test_goodput_cli_prints_the_table_and_json(halted, tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "hpctrain", "goodput", str(halted), "--json"], capture_output=True, text=True, check=True
    ).stdout
    led = json.loads(out)
    assert set(led["categories"]) == set(goodput.NAMES) and led["goodput"] > 0
    assert all(v["source"] for v in led["categories"].values())
    text = subprocess.run(
        [sys.executable, "-m", "hpctrain", "goodput", str(halted)], capture_output=True, text=True, check=True
    ).stdout
    assert "productive" in text and "of the wall time" in text and "goodput " in text
    (tmp_path / METRICS).write_text('{"kind": "train", "time": 1.0, "step": 1}\n')  # a run from before 0.5
    bad = subprocess.run([sys.executable, "-m", "hpctrain", "goodput", str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 2 and "no start-up record yet" in bad.stderr, bad.stderr


def test_the_report_draws_a_bar_per_attempt_and_the_productive_time(halted):
    report = pytest.importorskip("hpctrain.watch.report")
    run = report.load_run(halted)
    assert run.ledger is not None and len(run.ledger.attempts) == 2
    fig = report.figure([run], "step")
    titles = [ax.get_title() for ax in fig.axes]
    assert "goodput: where each attempt's time went" in titles and "productive time vs wall time" in titles
    bars = next(ax for ax in fig.axes if ax.get_title().startswith("goodput"))
    labels = [t.get_text() for t in bars.get_yticklabels()]
    assert labels == ["g attempt 0 (from step 0)", "g attempt 0 (from step 13)", "g (whole run)"], labels


def test_each_attempt_ends_with_a_goodput_record_the_trackers_take(halted):
    recs = [r for r in goodput.run_records(halted) if r["kind"] == "goodput"]
    assert [(r["step"], r["attempts"]) for r in recs] == [(13, 1), (44, 2)]  # the halt's, then the end's
    for r in recs:
        parts = sum(r[f"{c}_s"] for c in goodput.NAMES if c != "queue")
        assert r["attempt_s"] == pytest.approx(parts, abs=0.01) and r["productive_s"] > 0
    assert scalars(recs[-1])["goodput/productive_s"] == recs[-1]["productive_s"]

"""`hpctrain status`: ETA, speed, straggler, last eval and checkpoint age, as text and --json
(watch/summary.py, watch/render.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from hpctrain.watch.progress import duration, iso
from hpctrain.watch.render import status_text
from hpctrain.watch.summary import run_status
from tests.helpers import DIGITS, ROOT, digits_args, hpctrain, run_metrics, run_ranks

T0 = 1_700_000_000.0


def test_status_of_a_stopped_run_waiting_for_its_requeue(tmp_path):
    """Two stops; the first one's queue wait (600 s) predicts the second's; straggler and hang shown."""
    recs = [
        {"kind": "train", "time": T0 + 5 * i, "step": 10 * i, "epoch": i / 2, "loss": 2.0, "images_per_s": 128.0}
        for i in range(1, 5)
    ]  # 2 steps/s, 20 steps per epoch
    recs += [
        {"kind": "eval", "time": T0 + 21, "step": 40, "epoch": 2.0, "top1": 61.0, "top5": 93.5, "loss": 1.2},
        {"kind": "checkpoint", "time": T0 + 22, "step": 40, "path": "ck/step-40"},
        {"kind": "stop", "time": T0 + 22, "step": 40, "reason": "preempted", "stop_kind": "time_limit"},
        {"kind": "requeue", "time": T0 + 22, "step": 40, "requeue": True, "reason": "time_limit"},
    ]
    resumed = T0 + 22 + 600  # back after 600 s in the queue, then 10 steps to the next record
    recs += [
        {
            "kind": "train",
            "time": resumed + 5 * i,
            "step": 40 + 10 * i,
            "epoch": 2 + i / 2,
            "loss": 1.5,
            "images_per_s": 128.0,
            "mfu": 0.35,
        }
        for i in range(1, 3)
    ]
    recs += [
        {
            "kind": "straggler",
            "time": resumed + 10,
            "step": 60,
            "rank": 3,
            "host": "n2",
            "gpu": 1,
            "step_time_s": 0.7,
            "median_s": 0.5,
            "slower_pct": 40.0,
            "cause": "data",
            "data_wait_s": 0.2,
        },
        {
            "kind": "hang",
            "time": resumed + 70,
            "step": 60,
            "ranks": [3],
            "where": ["loader.py:88"],
            "files": ["logs/stack-rank-3.txt"],
        },
        {"kind": "stop", "time": resumed + 80, "step": 60, "reason": "preempted", "stop_kind": "preemption"},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "config.yaml").write_text("train:\n  epochs: 10\n  max_steps: 0\ndata:\n  batch_size: 64\n")
    (tmp_path / "job.json").write_text(json.dumps({"job_id": "7", "executor": "local"}))
    now = resumed + 180  # the queue wait of the second stop is 100 s old
    st = run_status(str(tmp_path), now=now)
    f = st.facts()
    left = (200 - 60) / 2.0
    assert f["total_steps"] == 200 and f["steps_per_s"] == 2.0 and f["stopped_at"] == 60
    at = resumed + 80 + 600 + left  # the second stop + the first one's queue wait + the steps left
    assert f["eta_s"] == pytest.approx(at - now) and f["eta_at"] == iso(at)
    assert f["checkpoint_age_s"] == now - (T0 + 22) and f["last_eval"]["top5"] == 93.5
    assert f["mfu"] == 0.35 and f["straggler"]["rank"] == 3 and f["hang"]["ranks"] == [3]
    text = status_text(st)
    assert (
        f"ETA            {duration(f['eta_s'])} (at {f['eta_at']}), counting the mean queue wait of its 1 earlier "
        "requeue(s), 10m00s" in text
    )
    assert "speed          128 images/s, 2 steps/s, MFU 35.0 %" in text
    assert "straggler      rank 3 (host n2, GPU 1) 40 % slower than the median at step 60: data" in text
    assert (
        "hang           at step 60: rank 3 at loader.py:88 not at the latest step; dumps: logs/stack-rank-3.txt" in text
    )
    assert "last eval      top-1 61.00 %, top-5 93.50 % at step 40" in text
    assert f"checkpoint     ck/step-40 (step 40, {duration(now - T0 - 22)} ago)" in text
    assert "last step      60/200 (30 %), epoch 3.00" in text


def test_a_local_run_stopped_by_ctrl_c_twice_then_killed_counts_no_node_failure_and_has_no_eta(tmp_path):
    """Two Ctrl-C stops, each resumed, then the process killed (no stop record, no job): its stops
    are counted as Ctrl-C's, not as node failures, and a run with no live process has no ETA."""
    recs = []
    for i, step in enumerate((10, 20)):
        recs.append({"kind": "train", "time": T0 + 10 * i, "step": step - 5, "epoch": 0.1, "loss": 2.0})
        recs.append(
            {"kind": "stop", "time": T0 + 10 * i + 1, "step": step, "reason": "interrupted", "stop_kind": "interrupt"}
        )
    recs.append({"kind": "train", "time": T0 + 30, "step": 25, "epoch": 0.5, "loss": 1.9, "images_per_s": 90.0})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "config.yaml").write_text("train:\n  epochs: 1\n  max_steps: 50\ndata:\n  batch_size: 64\n")
    st = run_status(str(tmp_path), now=T0 + 40)
    f = st.facts()
    assert st.state == "NOT RUNNING" and f["eta_s"] is None and f["eta_at"] is None, f
    text = status_text(st)
    assert "stops          2 (2 after Ctrl-C)\n" in text and "node failure" not in text, text
    assert "ETA            none: no process of this run is alive" in text, text


@pytest.mark.slow
def test_status_json_of_a_finished_local_run(digits_root, tmp_path):
    run_ranks(1, digits_args(digits_root, tmp_path, "st", "train.max_steps=6", "log.every=2", "ckpt.every=3"))
    run = tmp_path / "st"
    r = hpctrain("status", str(run), "--json")
    assert r.returncode == 0, r.stderr
    f = json.loads(r.stdout)
    train, (end,) = run_metrics(run, "train"), run_metrics(run, "end")
    ckpt = run_metrics(run, "checkpoint")[-1]
    assert (f["state"], f["step"], f["total_steps"], f["loss"]) == ("COMPLETED", 6, 6, train[-1]["loss"])
    assert f["images_per_s"] == train[-1]["images_per_s"] and f["mfu"] == train[-1].get("mfu")
    assert (f["eta_s"], f["eta_note"], f["eta_at"]) == (0.0, "finished", iso(end["time"]))
    assert f["last_eval"]["step"] == 6 and f["last_eval"]["top1"] == end["top1"]
    assert (f["checkpoint"], f["checkpoint_step"]) == (ckpt["path"], 6) and f["checkpoint_age_s"] >= 0
    assert f["straggler"] is None and f["requeues"] == 0
    code = (
        "import sys; sys.modules['torch'] = None\n"  # a login node's status: no torch
        f"from hpctrain.cli import main; raise SystemExit(main(['status', {str(run)!r}]))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and f"ETA            finished at {iso(end['time'])}" in r.stdout, r.stdout + r.stderr


def test_status_json_is_strict_json_with_a_diverged_loss(tmp_path, capsys):
    import argparse

    from hpctrain.cli.status import status

    rec = {"kind": "train", "time": T0, "step": 3, "epoch": 0.1, "loss": float("nan"), "images_per_s": 10.0}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(rec) + "\n")  # Python writes NaN, as the Trainer would
    assert status(argparse.Namespace(target=str(tmp_path), json=True)) == 0
    out = capsys.readouterr().out
    assert json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in --json"))["loss"] is None


def test_the_docs_status_sample_agrees_with_itself():
    """The `status` sample of the digits demo (docs/observability.md, "Status: when will it end"; the
    README's until issue 37): images/s ÷ the demo's global batch is its steps/s within 10 % (the
    speed is the last record's, the steps/s the last intervals'), and the ETA is the steps left at
    that rate."""
    page = (ROOT / "docs" / "observability.md").read_text()
    sample = page.split("$ hpctrain status runs/digits_vit", 1)[1].split("```", 1)[0]
    speed = re.search(r"speed\s+([\d,.]+) images/s, ([\d.]+) steps/s", sample)
    step = re.search(r"last step\s+(\d+)/(\d+)", sample)
    eta = re.search(r"ETA\s+(?:(\d+)m)?(\d+)s", sample)
    assert speed and step and eta, sample
    batch = yaml.safe_load(DIGITS.read_text())["data"]["global_batch"]
    images_per_s, steps_per_s = float(speed.group(1).replace(",", "")), float(speed.group(2))
    assert images_per_s / batch == pytest.approx(steps_per_s, rel=0.1), (images_per_s, steps_per_s)
    left_s = (int(step.group(2)) - int(step.group(1))) / steps_per_s
    assert int(eta.group(1) or 0) * 60 + int(eta.group(2)) == pytest.approx(left_s, rel=0.1, abs=2), left_s


def test_status_names_the_nodes_the_batch_shell_left_out_before_any_rank_records_them(tmp_path):
    """The batch shell writes `.hpctrain/excluded-<job>` as it leaves a node out (exclude.sh); a job
    requeued without the node waits in the queue, and no rank has recorded the exclusion yet (metrics
    has none). `status` names each node with its own evidence from that file; a node whose `exclude`
    record is in metrics keeps the record's evidence."""
    why = (
        "n3: probe step failed (exit 2): nvidia-smi -L lists 0 of the 1 GPU(s) the job uses; "
        "n4: left the job's allocation (Slurm: node failure)"
    )
    (tmp_path / ".hpctrain").mkdir()
    (tmp_path / ".hpctrain" / "excluded-77").write_text(
        f"{int(T0)}\tn3\t{why}\n{int(T0)}\tn4\t{why}\n{int(T0)}\tn1\tn1: batch host n1 DOWN\ngarbage\n"
    )
    (tmp_path / "job.json").write_text(json.dumps({"job_id": "77", "executor": "slurm"}))
    rec = {"kind": "exclude", "time": T0, "job": "77", "attempt": 0, "nodes": ["n1"], "why": "n1: recorded by rank 0"}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(rec) + "\n")
    st = run_status(str(tmp_path), now=T0 + 60)
    assert st.facts()["excluded_nodes"] == {
        "n1": "recorded by rank 0",
        "n3": "probe step failed (exit 2): nvidia-smi -L lists 0 of the 1 GPU(s) the job uses",
        "n4": "left the job's allocation (Slurm: node failure)",
    }
    assert re.search(
        r"excluded +n1 \(recorded by rank 0\); n3 \(probe step failed \(exit 2\): nvidia-smi -L lists 0 of the 1 "
        r"GPU\(s\) the job uses\); n4 \(left the job's allocation \(Slurm: node failure\)\)",
        status_text(st),
    ), status_text(st)

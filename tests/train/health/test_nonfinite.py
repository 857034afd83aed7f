"""Non-finite losses and spikes: no checkpoint from a poisoned state, rollbacks that skip the batches
that led there, and a clean stop (one line, non-zero exit) when rolling back is not allowed or used up."""

from __future__ import annotations

import math

import pytest
import torch

from hpctrain.config import ConfigError, HealthConfig, build
from hpctrain.train.ckpt import checkpoint as ckpt
from hpctrain.train.health.guard import SpikeWatch, injected_nan
from hpctrain.watch.render import divergence_text
from hpctrain.watch.summary import summarize
from tests.helpers import digits_args, hpctrain, run_metrics, run_ranks

# 22 steps per epoch; checkpoints every 5 steps, the loss read every 10: a NaN at step 12 is first
# read before the checkpoint of step 15, which must not be written
SETS = ["train.max_steps=25", "log.every=10", "ckpt.every=5", "ckpt.keep=2"]


def assert_finite_checkpoints(run_dir) -> list[int]:
    """Every checkpoint on disk has finite weights and optimizer state; returns their steps."""
    steps = []
    for p in ckpt.list_checkpoints(run_dir):
        st = ckpt.load(p)
        for k, v in st["model"].items():
            assert torch.isfinite(v).all(), f"{p.name}: model.{k} is not finite"
        for i, s in st["optimizer"]["state"].items():
            assert all(torch.isfinite(t).all() for t in s.values() if torch.is_tensor(t)), f"{p.name}: optim {i}"
        steps.append(ckpt.step_of(p))
    return steps


@pytest.mark.slow
def test_nan_on_one_rank_rolls_back_and_skips_then_finishes(digits_root, tmp_path):
    run_ranks(
        2,
        digits_args(digits_root, tmp_path, "nan", *SETS, "train.eval_every_epochs=1", "ckpt.keep_best=true"),
        env={"HPCTRAIN_TEST_NAN": "1:12"},
    )
    run = tmp_path / "nan"
    steps = assert_finite_checkpoints(run)
    assert max(steps) == 25
    evals = run_metrics(run, "eval")  # steps 22 (an epoch) and 25 (the end): the best one's checkpoint stays
    assert [e["step"] for e in evals] == [22, 25]
    assert max(evals, key=lambda e: (e["top1"], -e["step"]))["step"] in steps
    [bad] = run_metrics(run, "nonfinite")
    assert (bad["step"], bad["reason"]) == (15, "nonfinite")  # read before step 15's checkpoint
    [rb] = run_metrics(run, "rollback")
    assert (rb["step"], rb["from_step"], rb["skip_batches"], rb["data_offset"]) == (10, 15, 5, 5)
    assert rb["checkpoint"].startswith("step-00000010")
    assert [r["status"] for r in run_metrics(run, "end")] == ["finished"]
    assert all(math.isfinite(r["loss"]) for r in run_metrics(run, "train"))
    assert ckpt.load(ckpt.list_checkpoints(run)[0])["data_offset"] == 5  # the loader ran 5 batches ahead
    status = hpctrain("status", str(run))
    assert "1 event(s), 1 rollback(s); last: nonfinite at step 15, rolled back to step 10" in status.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "nan,setting,why",
    [
        ("1:12", "health.on_nonfinite=stop", "health.on_nonfinite=stop"),
        ("1:12:always", "health.max_rollbacks=1", "health.max_rollbacks=1 used up"),
    ],
)
def test_nan_stops_with_the_reason_and_a_nonzero_exit(nan, setting, why, digits_root, tmp_path):
    out = run_ranks(
        2, digits_args(digits_root, tmp_path, "stop", *SETS, setting), env={"HPCTRAIN_TEST_NAN": nan}, check=False
    )
    assert [r.returncode for r in out] == [2, 2], out[0].stdout[-3000:]
    line = f"hpctrain: error: training stopped at step 15: a non-finite loss or gradient norm ({why})"
    assert line in out[0].stdout
    run = tmp_path / "stop"
    assert max(assert_finite_checkpoints(run)) == 10  # nothing at or after the bad step
    [stop] = run_metrics(run, "stop")
    assert (stop["stop_kind"], stop["detail"]) == ("nonfinite", why)
    assert not run_metrics(run, "end")


@pytest.mark.slow
def test_digits_at_lr_50_never_finishes_with_nan_weights(digits_root, tmp_path):
    """The demo diverged at optim.lr=50 to "finished" with NaN checkpoints: now it rolls back, and
    stops with the reason when the rollbacks are used up (it diverges again after each)."""
    r = hpctrain(
        *digits_args(
            digits_root,
            tmp_path,
            "lr50",
            "optim.lr=50",
            "train.max_steps=40",
            "log.every=5",
            "ckpt.every=5",
        )[2:],
        timeout=300,
    )
    run = tmp_path / "lr50"
    assert_finite_checkpoints(run)
    assert run_metrics(run, "rollback"), r.stderr[-3000:]
    if r.returncode == 0:  # it recovered: a healthy finish
        assert all(math.isfinite(x["loss"]) for x in run_metrics(run, "train")[-1:])
    else:
        assert r.returncode == 2 and "hpctrain: error: training stopped at step" in r.stderr
        assert "finished" not in [x["status"] for x in run_metrics(run, "end")]


def test_spike_watch_flags_a_loss_above_factor_times_the_median():
    w = SpikeWatch(2.0, 4)
    assert [w.check(x) for x in (3.0, 2.5, 2.4)] == [None, None, None]  # 3 values before any judgement
    assert w.check(5.2) == 2.5  # > 2 × median(3.0, 2.5, 2.4)
    assert w.check(4.0) is None  # the spike did not join the window
    assert SpikeWatch(0.0, 4).check(1e9) is None  # off


def test_injected_nan_spec():
    assert injected_nan(1, {"HPCTRAIN_TEST_NAN": "1:12"}) == (12, False)
    assert injected_nan(1, {"HPCTRAIN_TEST_NAN": "1:12:always"}) == (12, True)
    assert injected_nan(0, {"HPCTRAIN_TEST_NAN": "1:12"}) == (0, False)
    with pytest.raises(ValueError, match="rank:step"):
        injected_nan(0, {"HPCTRAIN_TEST_NAN": "1:12:often"})


def test_spike_factor_at_most_one_is_refused():
    with pytest.raises(ConfigError, match="health.spike_factor=1 .* use a factor > 1"):
        build(HealthConfig, {"spike_factor": 1.0})


def test_prune_keeps_the_protected_good_checkpoint(tmp_path):
    for step in (5, 10, 15, 20):
        ckpt.save(tmp_path, step, {"model": {}, "step": step}, keep=2, protect=(5,))
    assert [ckpt.step_of(p) for p in ckpt.list_checkpoints(tmp_path)] == [20, 15, 5]


def test_status_names_the_last_divergence_and_its_rollback():
    m = summarize(
        [
            {"kind": "nonfinite", "step": 15, "reason": "spike", "loss": 9.0, "median": 2.0},
            {"kind": "rollback", "step": 10, "from_step": 15, "checkpoint": "step-00000010", "skip_batches": 5},
        ]
    )
    assert divergence_text(m) == (
        "1 event(s), 1 rollback(s); last: spike at step 15, rolled back to step 10 (step-00000010), 5 batches skipped"
    )

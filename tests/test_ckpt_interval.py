"""`ckpt.every: auto`: Young/Daly's interval from the save and step times a run measures."""

from __future__ import annotations

import math

import pytest

from hpctrain.ckpt_interval import AutoInterval, StepClock, interval_steps, young_daly_s
from hpctrain.config import ConfigError, load
from hpctrain.train.ckpt import checkpoint as ckpt
from tests.helpers import DIGITS, digits_args, run_metrics, run_ranks


def test_young_daly_interval():
    # a one-minute save, a 10-hour MTBF: sqrt(2 x 60 x 36000) = 2078 s between checkpoints
    assert young_daly_s(60, 36_000) == pytest.approx(2078.46, abs=0.01)
    assert interval_steps(60, 2.0, 36_000) == 1039  # of 2-second steps
    assert interval_steps(0.001, 10.0, 3600) == 1  # never less than every step
    for bad in ((60, 0), (-1, 3600)):
        with pytest.raises(ValueError):
            young_daly_s(*bad)


def test_auto_interval_measures_first_and_recomputes_when_the_save_time_moves():
    auto = AutoInterval(first=10, mtbf_h=1.0, mtbf_source="test")
    auto.start(0)
    assert not auto.due(9) and auto.due(10)
    rec = auto.saved(10, save_s=2.0, step_s=0.5)
    want = round(math.sqrt(2 * 2.0 * 3600) / 0.5)  # 240 steps
    assert rec["interval_steps"] == want and auto.next_step == 10 + want and rec["previous_steps"] is None
    assert auto.saved(auto.next_step, save_s=2.5, step_s=0.5) is None  # within 1.5x: same interval
    rec = auto.saved(auto.next_step, save_s=8.0, step_s=0.5)  # 4x slower saves: a longer interval
    assert rec["interval_steps"] == round(math.sqrt(2 * 8.0 * 3600) / 0.5) and rec["previous_steps"] == want
    auto.start(100)  # a rollback or resume keeps the measured interval
    assert auto.next_step == 100 + rec["interval_steps"]


def test_step_clock_leaves_out_the_first_window():
    clock = StepClock()
    assert clock.step_s() is None
    clock.add(5, 10.0)  # start-up
    assert clock.step_s() == 2.0
    clock.add(5, 1.0)
    clock.add(5, 2.0)
    assert clock.step_s() == pytest.approx(0.3)


def test_ckpt_every_takes_steps_or_auto():
    assert load(DIGITS, ["ckpt.every=auto"]).ckpt.every == "auto"
    assert load(DIGITS, ["ckpt.every=50"]).ckpt.every == 50
    with pytest.raises(
        ConfigError,
        match=r"ckpt\.every='often' is not allowed: use a number of optimizer "
        r"steps \(0: only at the end\) or auto",
    ):
        load(DIGITS, ["ckpt.every=often"])


@pytest.mark.slow
def test_auto_interval_follows_from_the_measured_inputs(digits_root, tmp_path):
    """2 ranks (they agree on the slowest save and step), a first save at step 4, then every
    interval steps as the ckpt_interval records say; an MTBF of 0.72 s keeps the interval at a few steps however
    loaded the machine."""
    out = run_ranks(
        2,
        digits_args(
            digits_root,
            tmp_path,
            "r",
            "train.max_steps=24",
            "log.every=2",
            "ckpt.every=auto",
            "ckpt.auto_first=4",
            "ckpt.mtbf_h=0.0002",
            "ckpt.keep=20",
        ),
        timeout=240,
    )
    recs = run_metrics(tmp_path / "r", "ckpt_interval")
    assert recs and recs[0]["step"] == 4 and recs[0]["mtbf_source"] == "ckpt.mtbf_h"
    for r in recs:
        assert r["interval_steps"] == interval_steps(r["save_s"], r["step_s"], 0.0002 * 3600)
        assert r["interval_s"] == pytest.approx(math.sqrt(2 * r["save_s"] * 0.72))
        assert 0 < r["save_s"] < 10 and 0 < r["step_s"] < 10
    # every periodic save comes one interval (the one in force then) after the previous
    saved = [ckpt.step_of(p) for p in ckpt.list_checkpoints(tmp_path / "r")][::-1]
    periodic, every, want = [s for s in saved if s < 24], {r["step"]: r["interval_steps"] for r in recs}, [4]
    step, k = 4, every[4]
    while step + k < 24:
        step += k
        want.append(step)
        k = every.get(step, k)
    assert periodic == want and len(want) >= 2 and saved[-1] == 24
    log = (tmp_path / "r" / "logs" / "rank-0.log").read_text()
    assert f"checkpoint interval: every {recs[0]['interval_steps']} steps" in log, log
    assert "checkpoint interval" not in out[1].stdout  # rank 0's line

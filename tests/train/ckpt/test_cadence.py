"""train.ckpt.cadence: when a periodic checkpoint is due, and what ckpt.every=auto measures and records."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from hpctrain import ckpt_interval as interval
from hpctrain.run.metrics import MetricsWriter
from hpctrain.train.ckpt.cadence import Cadence


def ckpt(every, auto_first=5, mtbf_h=0.0) -> SimpleNamespace:
    return SimpleNamespace(every=every, auto_first=auto_first, mtbf_h=mtbf_h)


def test_a_step_count_is_due_at_its_multiples_and_zero_is_never_due():
    fixed, off = Cadence(ckpt(10), MetricsWriter(None)), Cadence(ckpt(0), MetricsWriter(None))
    assert [s for s in range(1, 31) if fixed.due(s)] == [10, 20, 30]
    assert not any(off.due(s) for s in range(1, 31))


def test_auto_saves_first_at_auto_first_then_at_young_dalys_interval_and_records_it(tmp_path):
    metrics = MetricsWriter(tmp_path / "metrics.jsonl")
    c = Cadence(ckpt("auto", auto_first=5, mtbf_h=1.0), metrics)
    c.restart(100)
    assert [s for s in range(100, 110) if c.due(s)][0] == 105
    c.pause(2.0)  # an eval inside the window: not training time
    c.window(10, 12.0)
    assert c.clock.step_s() == pytest.approx(1.0)
    c.saved(105, 8.0, periodic=True)  # a periodic save of 8 s: the interval from it and the 1 s step
    metrics.close()
    (rec,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = interval.interval_steps(8.0, 1.0, 3600.0)
    got = (rec["kind"], rec["step"], rec["interval_steps"], rec["next_step"])
    assert got == ("ckpt_interval", 105, steps, 105 + steps)
    assert c.due(105 + steps) and not c.due(104 + steps)
    assert c.paused_s == 8.0  # the save is paused out of the next window too


def test_a_save_already_on_disk_moves_auto_one_interval_on_and_a_non_periodic_one_does_not():
    c = Cadence(ckpt("auto", auto_first=3), MetricsWriter(None))
    c.restart(0)
    c.on_disk(3, periodic=True)  # a stop's checkpoint at the due step: the next one, auto_first on
    assert not c.due(5) and c.due(6)
    c.on_disk(6, periodic=False)
    assert c.due(6)

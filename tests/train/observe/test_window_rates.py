"""A log window's rates (images/s, step time, data wait, MFU) are net of the window's pauses: the
seconds of a checkpoint save or an eval inside the window are not training time (issue 58)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hpctrain.run.metrics import MetricsWriter
from hpctrain.train.ckpt.cadence import Cadence
from hpctrain.train.loop import Trainer
from hpctrain.train.observe.log_window import LogWindow
from hpctrain.train.observe.speed import speed_fields


class Records:
    def __init__(self) -> None:
        self.rows: list[tuple[str, dict]] = []

    def write(self, kind: str, **rec) -> None:
        self.rows.append((kind, rec))


def test_a_windows_rates_leave_out_its_save_and_eval_pauses():
    cadence = Cadence(SimpleNamespace(every=0, auto_first=5, mtbf_h=0.0), MetricsWriter(None))
    win = LogWindow(torch.device("cpu"))
    for _ in range(4):
        win.add(torch.tensor(1.0), torch.tensor(0.5), wait=0.5)
    win.elapsed = lambda: 10.0  # a fake clock: the window lasted 10 s ...
    cadence.pause(3.0)  # ... of which an eval took 3 s
    cadence.saved(4, 1.0, periodic=False)  # ... and a save 1 s: 6 s of training
    posted = []
    records = Records()
    trainer = SimpleNamespace(
        _window=lambda loss, gn: (float(loss), float(gn)),
        cadence=cadence,
        cfg=SimpleNamespace(data=SimpleNamespace(global_batch=60)),
        lr_of=lambda step: 1e-3,
        step=4,
        steps_per_epoch=100,
        speed=SimpleNamespace(fields=lambda ips, step_s: speed_fields(ips, step_s, 1, 1e12, 100.0)),
        stragglers=SimpleNamespace(post=lambda *a: posted.append(a), take=lambda: {"straggler_s": 0.25}),
        fwd_clock=SimpleNamespace(take=lambda: 0.0),
        train_loader=SimpleNamespace(skipped=[]),
        reduce_hook=None,
        dist=SimpleNamespace(world_size=1),
        metrics=records,
    )
    lp = SimpleNamespace(win=win, out=SimpleNamespace(), progress=SimpleNamespace(update=lambda *a: None))
    Trainer._log_window(trainer, lp)
    ((kind, rec),) = records.rows
    assert kind == "train"
    assert rec["images_per_s"] == pytest.approx(60 * 4 / 6.0)  # images / (window time - pauses)
    assert rec["step_time_s"] == pytest.approx(6.0 / 4)
    assert rec["data_wait"] == pytest.approx(2.0 / 6.0)
    assert rec["mfu"] == pytest.approx(40.0 * 1e12 / 100e12)
    assert posted[0][1] == pytest.approx(6.0 / 4)  # the straggler check's step time too
    assert cadence.clock.step_s() == pytest.approx(6.0 / 4) and cadence.paused_s == 0.0
    # the goodput ledger's split of the window (run/goodput.py): whole time, steps, data wait, saves, evals
    assert rec["window_s"] == 10.0 and rec["steps"] == 4 and rec["data_wait_s"] == 2.0
    assert (rec["ckpt_s"], rec["eval_s"], rec["straggler_s"]) == (pytest.approx(1.0), pytest.approx(3.0), 0.25)
    assert cadence.take_pauses() == {"ckpt_s": 0.0, "eval_s": 0.0}  # taken by the window

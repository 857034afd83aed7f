"""Every command that takes a run takes it as `status` does: a run directory or a run's name under
./runs (`hpctrain eval NAME`, `hpctrain export NAME` as `hpctrain status NAME`)."""

from __future__ import annotations

import shutil

from hpctrain.cli import eval_cmd
from hpctrain.train.ckpt import export
from tests.cli.test_eval_cmd import run_args
from tests.helpers import DIGITS


def test_eval_and_export_take_a_run_name_under_runs(tmp_path, monkeypatch):
    run = tmp_path / "runs" / "r1"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(DIGITS, run / "config.yaml")
    (run / "checkpoints" / "step-5.pt").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    assert export.find("r1") == (run / "checkpoints" / "step-5.pt").resolve()
    cfg, weights, out = eval_cmd.resolve(run_args("r1"))
    assert cfg.model.num_classes == 10 and weights == str(run.resolve()) and out == run.resolve() / "eval"

"""Preemptions in a row (SIGUSR2 to one rank at random steps 1–2 apart, around the first epoch
boundary): the run finishes, and its final weights equal an uninterrupted run's. The signal reaches
one rank only, so the stop is agreed.

What this adds to the every-stop-path Slurm test (one stop per path): many resumes in a row, at
neighbouring steps and across an epoch boundary (the loader position, the mixup/drop-path/EMA
streams), so that a drift that grows with each resume shows. It was 20 stops from step 1 (~300 s
here), then 8 from step 16 (~170 s); 4 stops from step 19 cross the same boundary (22.5 steps an
epoch: the stops land at about 20, 22, 24 and 26), and one resume that drifts fails the bit-exact
comparison, so more stops add time, not coverage."""

from __future__ import annotations

import os
import random
import re
import signal

import pytest
import torch

from hpctrain.train.ckpt import checkpoint as ckpt
from tests.faults.local import last_step, start_ranks, wait_for_step
from tests.helpers import digits_args, run_metrics, run_ranks

STEPS, PREEMPTIONS, FIRST = 70, 4, 19
SETS = [f"train.max_steps={STEPS}", "aug.mixup=0.8", "model.drop_path=0.1", "train.ema=0.99"]


@pytest.mark.slow
def test_preemptions_in_a_row_equal_uninterrupted(digits_root, tmp_path):
    rnd = random.Random(7)
    run = tmp_path / "pre"
    stops = []
    for _ in range(PREEMPTIONS):
        procs = start_ranks(2, digits_root, tmp_path, "pre", *SETS)
        target = max(last_step(run), FIRST) + rnd.randint(1, 2)
        wait_for_step(run, target, procs)
        victim = rnd.randrange(2)
        os.kill(procs[victim].pid, signal.SIGUSR2)
        outs = [p.communicate(timeout=120)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), outs[0][-2000:] + outs[1][-2000:]
        assert re.search(r"status +preempted", outs[0])
        stops.append(ckpt.list_checkpoints(run)[0].name)
    assert len(set(stops)) == PREEMPTIONS  # each stop saved at its own step
    procs = start_ranks(2, digits_root, tmp_path, "pre", *SETS)
    out = procs[0].communicate(timeout=300)[0]
    procs[1].communicate(timeout=60)
    assert re.search(r"status +finished", out)
    lines = run_metrics(run)
    assert sum(x["kind"] == "stop" for x in lines) == PREEMPTIONS
    run_ranks(2, digits_args(digits_root, tmp_path, "straight", *SETS))
    a = ckpt.load(ckpt.list_checkpoints(run)[0])
    b = ckpt.load(ckpt.list_checkpoints(tmp_path / "straight")[0])
    assert a["step"] == b["step"] == STEPS
    for part in ("model", "ema"):
        for k, v in a[part].items():
            assert torch.equal(v, b[part][k]), f"{part}.{k}"

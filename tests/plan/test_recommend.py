"""Time to result without a cluster: sacct's rows → waits, the loss arithmetic, the recommendation and
its reason, the allocation share, and `hpctrain plan` where no Slurm answers."""

from __future__ import annotations

import json
import math

import pytest

from hpctrain.ckpt_interval import young_daly_s
from hpctrain.config import load
from hpctrain.memory import checkpoint_bytes
from hpctrain.plan.allocation import Allocation, share, tres
from hpctrain.plan.interruptions import Loss, Rate, expected_loss, node_rate
from hpctrain.plan.queue import Figure, History, bucket, partition_requeue_waits, queue_wait, requeue_wait
from hpctrain.plan.recommend import Option, recommend
from hpctrain.site.profile import load_profile
from hpctrain.site.slurm_cli import parse_sacct
from tests.helpers import ROOT, hpctrain

VIT_B = str(ROOT / "configs" / "vit_b16_imagenet.yaml")
SACCT = """\
10|COMPLETED|1|2026-12-01T10:00:00|2026-12-01T10:00:10|2026-12-01T11:00:10|3600
11|COMPLETED|1|2026-12-01T10:00:00|2026-12-01T10:01:00|2026-12-01T11:01:00|3600
12|TIMEOUT|1|2026-12-01T10:00:00|2026-12-01T10:02:00|2026-12-01T11:02:00|3600
13|PREEMPTED|2|2026-12-01T10:00:00|2026-12-01T10:00:30|2026-12-01T10:30:30|1800
13|COMPLETED|2|2026-12-01T10:31:00|2026-12-01T10:40:30|2026-12-01T11:40:30|3600
14|CANCELLED by 0|3|2026-12-01T10:00:00|Unknown|2026-12-01T10:05:00|0
16|CANCELLED by 0|1|2026-12-01T10:09:02|2026-12-01T10:08:52|2026-12-01T10:08:52|0
15|NODE_FAIL|8|2026-12-01T09:00:00|2026-12-01T12:00:00|2026-12-01T13:00:00|3600
"""


def test_sacct_rows_become_waits_per_power_of_two_size_class():
    allocs = parse_sacct(SACCT + "garbage line\n")
    assert len(allocs) == 8 and allocs[5].state == "CANCELLED" and allocs[5].start is None
    assert [bucket(n) for n in (1, 2, 3, 4, 7, 8, 15, 16)] == [1, 2, 2, 4, 4, 8, 8, 16]
    hist = History("gpu", 14, tuple(allocs))  # job 16: cancelled while pending (Start = End, 0 s): not a wait
    one = queue_wait(hist, 1, min_jobs=3)
    assert one.seconds == 60 and one.n == 3 and one.source.startswith("median of 3 jobs of 1 node that started")
    two = queue_wait(hist, 3, min_jobs=2)  # 2 and 3 nodes share a class; job 14 never started
    assert two.seconds == pytest.approx((30 + 570) / 2) and two.n == 2
    few = queue_wait(hist, 8, min_jobs=2)
    assert few.seconds is None and few.source == (
        "unknown: 1 jobs of 8-15 nodes that started (sacct, partition gpu, last 14 days), fewer than 2"
    )
    assert queue_wait(History("gpu", 14, None), 1).source.startswith("unknown: sacct does not answer")
    assert partition_requeue_waits(allocs) == [600.0]  # job 13: End 10:30:30 → next Start 10:40:30
    assert requeue_wait(hist, 2, min_jobs=1).seconds == 600
    fallback = requeue_wait(hist, 1, min_jobs=2)  # one requeue: a requeued job waits as a new one of its size
    assert fallback.seconds == 60 and fallback.source.startswith("as a new job's queue wait")


def test_interruption_rate_and_expected_loss():
    allocs = parse_sacct(SACCT)
    profile = load_profile("local")
    rate = node_rate(History("gpu", 14, tuple(allocs)), profile)
    node_h = (3 * 3600 + 2 * 1800 + 2 * 3600 + 8 * 3600) / 3600  # Σ NNodes × ElapsedRaw
    # PREEMPTED, NODE_FAIL; the TIMEOUT row is the job's own checkpointed stop, not an interruption
    assert rate.node_mtbf_h == pytest.approx(node_h / 2) and not rate.upper_bound
    assert rate.source.startswith(
        f"1 preemptions, 1 node failures in {node_h:g} node-hours of 8 "
        "allocations (sacct, partition gpu, last 14 days): 7 node-hours per interruption"
    )
    cfg = load(VIT_B, ["ckpt.every=auto"])
    requeue = Figure(600.0, "test")
    loss = expected_loss(cfg, profile, Rate(10.0, "t"), 4, train_s=36000.0, step_s=1.0, requeue=requeue)
    m = 10 * 3600 / 4  # job MTBF: 4 nodes interrupt it 4 times as often
    loss_save = checkpoint_bytes(cfg) / 1e9 / profile.slurm.ckpt_write_gbps  # as submit's stop check counts it
    tau = young_daly_s(loss_save, m)
    assert loss.interruptions == pytest.approx(36000 / m)
    assert loss.seconds == pytest.approx(36000 / tau * loss_save + 36000 / m * (tau / 2 + 600))
    fixed = expected_loss(load(VIT_B, ["ckpt.every=500"]), profile, Rate(10.0, "t"), 4, 36000.0, 2.0, requeue)
    assert fixed.seconds == pytest.approx(36000 / 1000 * loss_save + 36000 / m * (1000 / 2 + 600))
    assert expected_loss(cfg, profile, Rate(None, "unknown: x"), 4, 1.0, 1.0, requeue).seconds is None
    none_seen = node_rate(
        History(
            "gpu",
            14,
            tuple(
                parse_sacct(
                    SACCT.replace("PREEMPTED", "COMPLETED")
                    .replace("NODE_FAIL", "COMPLETED")
                    .replace("TIMEOUT", "COMPLETED")
                )
            ),
        ),
        profile,
    )
    assert none_seen.upper_bound and none_seen.source.endswith(f"at least {node_h:.3g} node-hours per interruption")
    assert node_rate(History("gpu", 14, ()), load_profile("local", ["slurm.node_mtbf_hours=500"])).node_mtbf_h == 500


def _opt(nodes: int, train_h: float, queue_h: float | None, loss_h: float = 0.0, n: int = 23, **kw) -> Option:
    what = f"{n} jobs of {nodes}-{2 * nodes - 1} nodes that started (sacct)"
    q = (
        Figure(queue_h * 3600, f"median of {what}", n)
        if queue_h is not None
        else Figure(None, f"unknown: {what}, fewer than 5", n)
    )
    return Option(
        nodes,
        8 * nodes,
        4096 // (8 * nodes),
        1.0,
        0.9,
        train_h * 3600,
        train_h * 8 * nodes,
        q,
        Loss(loss_h * 3600, "t"),
        None,
        "",
        **kw,
    )


def test_recommendation_names_what_made_the_difference():
    rec, why = recommend([_opt(4, 60, 1), _opt(8, 30, 1), _opt(16, 24, 14)])
    assert rec.nodes == 8
    assert why == (
        "8 nodes: done in 31.0 h vs 38.0 h for 16, which waits ~14.0 h in the queue (median of 23 jobs "
        "of 16-31 nodes that started (sacct))"
    )
    rec, why = recommend([_opt(8, 30, 1), _opt(16, 16, 1, loss_h=20)])
    assert rec.nodes == 8 and why.endswith("for 16, which loses ~20.0 h to interruptions")
    rec, why = recommend([_opt(8, 30, 1), _opt(16, 16, 2)])
    assert rec.nodes == 16 and why.startswith("16 nodes: done soonest, in 18.0 h (train 16.0 h + queue 2.0 h")
    rec, why = recommend([_opt(8, 30, None), _opt(16, 16, None)])
    assert rec.nodes == 16 and why.startswith("16 nodes trains soonest (16.0 h); time to result unknown")
    rec, why = recommend([_opt(8, 30, None, excluded="never: partition p has only 4 nodes (sinfo)")])
    assert rec is None and "8: never: partition p has only 4 nodes" in why


def test_allocation_share_against_grp_tres_mins():
    assert tres("cpu=10,gres/gpu=4,bad,mem=x") == {"cpu": 10.0, "gres/gpu": 4.0}
    alloc = Allocation(
        "a", "u", "0", "0.5", {"gres/gpu": 60_000.0}, "account a", {"gres/gpu": 20_000.0}, {"gres/gpu": 10_000.0}
    )
    frac, how = share(alloc, nodes=2, gpus_per_node=8, cpus_per_node=0, hours=10)
    assert frac == pytest.approx(2 * 8 * 10 * 60 / 30_000) and how == "gres/gpu-minutes: needs 9,600 of the 30,000 left"
    assert share(Allocation("a", "u", limit={"billing": 5.0}), 2, 8, 0, 1.0)[0] is None
    assert share(Allocation("a", "u"), 2, 8, 0, 1.0) == (None, "no GrpTRESMins limit")
    spent = Allocation("a", "u", limit={"node": 10.0}, used={"node": 10.0})
    assert share(spent, 1, 8, 0, 1.0)[0] == math.inf


@pytest.mark.slow
def test_plan_without_slurm_keeps_the_training_columns_and_says_the_queue_is_unknown(tmp_path):
    r = hpctrain("plan", "--config", VIT_B, "--nodes", "4,8,16", "--cluster", "none", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["nodes"] == [4, 8, 16] and [row["nodes"] for row in out["rows"]] == [4, 8, 16]
    assert out["target"] is None and out["unknown_because"] == "--cluster none"
    for o, row in zip(out["options"], out["rows"]):
        assert o["train_s"] == row["total_s"] > 0 and o["gpu_hours"] == row["gpu_hours"]
        assert o["queue_s"] is None and o["result_s"] is None and o["queue_source"] == "unknown: --cluster none"
    fastest = min(out["options"], key=lambda o: o["train_s"])["nodes"]  # the local profile's socket fabric
    assert out["recommend"]["nodes"] == fastest
    assert "time to result unknown: --cluster none" in out["recommend"]["reason"]
    # no Slurm client on PATH at all (the example-ib profile names partition gpu)
    (tmp_path / "bin").mkdir()
    r = hpctrain(
        "plan", "--config", VIT_B, "--nodes", "8", "--cluster", "example-ib", env={"PATH": str(tmp_path / "bin")}
    )
    assert r.returncode == 0, r.stderr
    # the table's header names the partition its sources name (issue 56: it said "no partition")
    assert "per-GPU batch 16; predicted" in r.stdout and "time to result (partition gpu):" in r.stdout, r.stdout
    assert (
        "queue at 1,2,4,8,16 node(s): unknown: no Slurm here (sacct and sinfo do not answer for partition gpu)"
        in r.stdout
    ), r.stdout
    r = hpctrain("plan", "--config", VIT_B, "--nodes", "4,x")
    assert (
        r.returncode == 2
        and "invalid node count, comma-separated list (e.g. 4,8,16) or range (e.g. 12-16) value: '4,x'" in r.stderr
    )
    r = hpctrain("plan", "--config", VIT_B, "--nodes", "4", "--history-days", "0")
    assert r.returncode == 2
    assert r.stderr == "hpctrain: error: --history-days 0: give a positive number of days, e.g. 7\n"

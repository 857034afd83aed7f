"""The shared file system's budget (issue 55): at most FS_BUDGET_OPS_S (2) metadata operations a second
per job in steady state, at 128 nodes × 8 GPUs. Counted, not assumed: a real 4-rank gloo run, two ranks
on each of two "nodes" (SLURMD_NODENAME, LOCAL_RANK, LOCAL_WORLD_SIZE as srun/torchrun set them), every
metadata operation of every rank under the run directory recorded (fsops_worker.py: Python's audit
events and the stat calls), then carried to 128 nodes by arithmetic from the counted per-node figure."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest

from hpctrain.train import stop as stopmod
from hpctrain.train.health import watchdog as wd
from tests.helpers import digits_args, run_metrics, run_ranks

WORKER = Path(__file__).with_name("fsops_worker.py")
HANG = 10  # health.hang_timeout_s: the watchdog ticks every 1 s; 2 nodes publish every 4 s
STEPS = 400
NODES, PER_NODE = 128, 8  # the job the budget is for


def ops(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()]


def named(evs: list[dict], name: str) -> list[dict]:
    return [e for e in evs if Path(e["path"]).name == name]


@pytest.mark.slow  # 4 ranks train ~400 steps: ~1 min on 2 cores
def test_heartbeats_cost_one_writer_per_node_within_the_budget_and_each_log_is_opened_once(digits_root, tmp_path):
    runs = tmp_path / "runs"
    (runs / ".hpctrain").mkdir(parents=True)
    end_file = runs / ".hpctrain" / "end-1"  # the batch shell's clock (launch/shell/clock.sh): a day away
    end_file.write_text(f"{int(time.time()) + 86400}\n")
    env = [
        {
            "SLURMD_NODENAME": f"n{r // 2}",
            "LOCAL_RANK": str(r % 2),
            "LOCAL_WORLD_SIZE": "2",
            "HPCTRAIN_END_FILE": str(end_file),
        }
        for r in range(4)
    ]
    outs = [tmp_path / f"ops-{r}.jsonl" for r in range(4)]
    for r, out in enumerate(outs):
        env[r]["HPCTRAIN_TEST_FSOPS_OUT"] = str(out)
    argv = digits_args(digits_root, runs, "fs", f"train.max_steps={STEPS}", f"health.hang_timeout_s={HANG}")
    run_ranks(4, [str(WORKER), str(runs), *argv], rank_env=env, timeout=900)
    run = runs / "fs"
    steps = {r["step"]: r["time"] for r in run_metrics(run, "train")}
    t0, t1 = steps[min(s for s in steps if s >= 20)], steps[max(steps)]  # steady: after start-up, before the end
    window = t1 - t0
    every = [ops(out) for out in outs]
    steady = [[e for e in evs if t0 <= e["t"] <= t1] for evs in every]
    detail = "\n".join(f"rank {r}: {Counter((e['op'], Path(e['path']).name) for e in s)}" for r, s in enumerate(steady))

    # the node's other ranks touch nothing of the run directory: their beats stay in the node's memory,
    # and the stop agreement brings them rank 0's reading of the end file
    assert steady[1] == [] and steady[3] == [], detail
    period = json.loads((run / "env.json").read_text())["resolved"]["heartbeat_period_s"]  # what the run recorded
    assert period == wd.heartbeat_period(2, wd.tick(HANG)) and window >= 4 * period, (
        f"a steady state of {window:.1f} s is too short to count\n{detail}"
    )

    per_publish = []
    for r in (0, 2):  # each node's writer: its node's file (a temp file and a rename) and one stat of hang.json
        node_file = wd.NODE_HEARTBEAT.format(r)
        beats = [e for e in steady[r] if e["path"] != str(end_file)]
        publishes = [e for e in beats if e["op"] == "rename" and Path(e["path"]).name.startswith(f".{node_file}.")]
        assert 1 <= len(publishes) <= window / period + 1, (len(publishes), window, detail)  # at its period
        n = len(publishes)
        assert Counter(e["op"] for e in beats) == {"create": n, "rename": n, "stat": n}, detail
        assert len(named(beats, wd.TRIGGER)) == n, detail  # the stat is hang.json's
        per_publish.append(len(beats) / n)
    end_reads = [e for e in steady[0] if e["path"] == str(end_file)]
    assert [e for e in steady[2] if e["path"] == str(end_file)] == [], detail  # rank 0 only
    assert {e["op"] for e in end_reads} == {"stat"} and 2 <= len(end_reads) <= window / stopmod.END_FILE_POLL_S + 1, (
        detail
    )
    ops_s = sum(len(s) for s in steady) / window
    per_rank_min = ops_s / 4 * 60
    assert ops_s <= (2 * wd.OPS_PER_PUBLISH * (window / period + 1) + len(end_reads)) / window, (ops_s, detail)

    # carried to 128 nodes × 8 ranks by arithmetic: the counted operations per node's publish at the period
    # the watchdog derives for that job (the default health.hang_timeout_s, 300 s: a 5 s tick), plus rank
    # 0's end-file reads, counted per second (one reader whatever the job's size)
    big_period = wd.heartbeat_period(NODES, 5.0)
    end_reads_s = (len(end_reads) - 1) / (end_reads[-1]["t"] - end_reads[0]["t"])  # between the first and last
    big_ops_s = NODES * max(per_publish) / big_period + end_reads_s
    assert max(per_publish) == wd.OPS_PER_PUBLISH and big_period == 320.0
    assert big_ops_s <= wd.FS_BUDGET_OPS_S, big_ops_s
    big_per_rank_min = big_ops_s * 60 / (NODES * PER_NODE)
    before = (
        NODES * PER_NODE * (wd.OPS_PER_PUBLISH / 5.0 + 1.0)
    )  # every rank: its heartbeat every 5 s, the end file every 1 s
    print(
        f"counted: {ops_s:.2f} ops/s for 2 nodes over {window:.0f} s ({per_rank_min:.1f} per rank per minute); "
        f"128 x 8: {big_ops_s:.2f} ops/s ({big_per_rank_min:.3f} per rank per minute), before {before:.0f} ops/s"
    )

    # each log file opened once: a rank's log, and the metrics file whatever the number of records
    for r in range(4):
        assert [e["op"] for e in named(every[r], f"rank-{r}.log")] == ["create"], named(every[r], f"rank-{r}.log")
    writes = [e for e in named(every[0], "metrics.jsonl") if e["op"] == "create"]
    assert 1 <= len(writes) <= 2 and len(steps) >= STEPS, writes  # never one per record

"""The goodput ledger of a real job (run/goodput.py, `hpctrain goodput`): a 2-node × 2-task job on the
Slurm test cluster through one killed rank (restarted in place) and one time-limit USR2 (checkpoint,
requeue, a second queue wait). Its categories, each measured from its own source, add up to the wall
time; the progress lost equals the steps trained again × the measured step time; the queue waits are
sacct's Submit → Start of each allocation.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics

import pytest

from hpctrain.run import goodput
from hpctrain.watch.ledger import sacct_time
from tests.helpers import wait_for
from tests.launch.jobs import (
    JOB_SETS,
    digits_sets,
    hp,
    job_report,
    metrics,
    submit,
    task_pid,
    wait_for_step,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_a_job_with_a_killed_rank_and_a_requeue_accounts_for_its_wall_time(slurm_cluster, digits_root, tmp_path):
    c = slurm_cluster
    run = tmp_path / "ledger"
    # rank 0 waits 0.3 s per step for data (a sleep: the faults land mid-run however fast the machine is)
    job = submit(
        c,
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        *digits_sets(digits_root, tmp_path, "ledger", *JOB_SETS, "ckpt.every=5"),
        env={"HPCTRAIN_TEST_DELAY": "0:0.3:data"},
    )
    wait_for_step(run, 8, 240)  # 3 steps past the step-5 checkpoint
    pid = task_pid(job, 3)  # on the second node
    assert pid, job_report(c, job, run)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: metrics(run, "restart"), "no restart record", 300, lambda: job_report(c, job, run))
    wait_for_step(run, 22, 300)
    c.run("scancel", "--signal=USR2", "--batch", job)
    wait_for(lambda: metrics(run, "stop"), "no stop record", 300, lambda: job_report(c, job, run))
    assert c.wait_done(job, 600) == "COMPLETED", job_report(c, job, run)

    out = hp(c, "goodput", job, "--json").stdout
    led = json.loads(out)
    cats = {k: v["seconds"] for k, v in led["categories"].items()}
    table = hp(c, "goodput", job).stdout
    print(table)
    # the categories, each from its own records, sum to the wall time (first Submit → last End) within 1 %
    assert abs(led["sum_s"] - led["wall_s"]) <= 0.01 * led["wall_s"], (led["sum_s"], led["wall_s"], table)
    assert cats["productive"] > 0 and cats["startup"] > 0 and cats["restart"] > 0, table

    # queue waits: sacct's Submit → Start of each allocation (the requeue is a second row)
    rows = c.run("sacct", "-n", "-X", "-P", "-D", "-j", job, "-o", "Submit,Start,State").stdout.split()
    waits = [sacct_time(r.split("|")[1]) - sacct_time(r.split("|")[0]) for r in rows]
    assert len(waits) == 2 and [r.split("|")[2] for r in rows] == ["REQUEUED", "COMPLETED"], rows
    parts = led["categories"]["queue"]["parts"]
    assert sorted(parts.values()) == pytest.approx(sorted(w for w in waits if w > 0), abs=0.01), (parts, waits)
    assert cats["queue"] == pytest.approx(sum(waits), abs=0.01)

    # lost progress: the steps the killed attempt trained past the checkpoint it resumed from, at the
    # measured step time (half a step more: the one in flight); the stop saved at its step, losing none
    log = (run / "logs" / "rank-0.log").read_text()
    resumed = [int(s) for s in re.findall(r"resumed from \S+ at step (\d+)", log)]
    (stop,) = metrics(run, "stop")
    assert len(resumed) == 2 and resumed[1] == stop["step"], (resumed, stop)
    redone = [r for r in goodput.run_records(run) if r.get("superseded") and r.get("kind") == "train"]
    reached = max(r["step"] for r in redone)
    step_s = statistics.median(r["step_time_s"] for r in redone)  # those steps' own: the load moves
    want = (reached - resumed[0] + 0.5) * step_s
    assert cats["lost"] == pytest.approx(want, rel=0.2), (cats["lost"], want, reached, resumed, step_s, table)

    # plan vs reality (run/goodput.plan_vs_actual, from <run>/plan.json that submit wrote): one interruption
    # (the killed rank; the time limit's stop was the run's own), the first queue wait as sacct has it
    plan = {r["key"]: r for r in led["plan"]}
    assert plan["interruptions"]["actual"] == 1 and plan["queue_s"]["actual"] == pytest.approx(waits[0], abs=0.01)
    assert plan["images_per_s"]["actual"] > 0 and plan["result_s"]["actual"] == led["wall_s"], plan
    assert "plan vs reality" in table

    # the attempts: two processes in the first allocation (the restart), one in the requeued one
    assert [(a["slurm_restart"], a["attempt"]) for a in led["attempts"]] == [(0, 0), (0, 1), (1, 0)], led["attempts"]
    # the report's goodput row (docs/img/goodput-report.png is this picture: HPCTRAIN_GOODPUT_PICTURE=PATH copies it)
    png = run / "report.png"
    hp(c, "report", str(run), "-o", str(png), "--x", "wall")
    assert png.stat().st_size > 10_000
    if os.environ.get("HPCTRAIN_GOODPUT_PICTURE"):
        shutil.copyfile(png, os.environ["HPCTRAIN_GOODPUT_PICTURE"])
    st = hp(c, "status", job).stdout
    assert re.search(r"time went to +goodput \d+\.\d % · runtime \d+\.\d % · ETTR", st), st
    print(
        f"goodput {100 * led['goodput']:.1f} %, runtime {100 * led['runtime_goodput']:.1f} %, "
        f"wall {led['wall_s']:.0f} s;"
        f" lost {cats['lost']:.2f} s vs {want:.2f} s ({reached - resumed[0]} steps × {step_s:.3f} s); queue {waits}"
    )

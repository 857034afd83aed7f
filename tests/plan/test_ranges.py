"""`hpctrain plan --nodes 12-16` for the 4k recipe: the range's row against a fixed 16, and which pays.

The queue history is a week of sacct rows in the format `slurm_cli.read_history` asks for (as
tests/plan/test_recommend.py's), dated back from now so that the 7-day window holds them: jobs of 8-15
nodes waited about 1 h, jobs of 16-31 nodes 5 h (a busy partition) or 1 h 5 min (a quiet one). The
CLI reads it through stand-ins of sacct/sinfo/squeue that print those rows, as tests/site/test_slurm_cli.py
stands in for Slurm's clients; what real sacct prints for a history is tests/plan/test_queue.py's.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from hpctrain import memory
from hpctrain import plan as planmod
from hpctrain.cli.plan import node_list
from hpctrain.config import load
from hpctrain.launch.batch import DEFAULT_GPU_MEM_GB
from hpctrain.node_range import NodeRange
from hpctrain.plan import ranges
from hpctrain.plan.interruptions import node_rate
from hpctrain.plan.queue import History, Now
from hpctrain.plan.recommend import Context, dur, options
from hpctrain.site.profile import load_profile
from hpctrain.site.slurm_cli import parse_sacct
from tests.helpers import ROOT, hpctrain
from tests.site.test_slurm_cli import CONFIG, fake

RECIPE = str(ROOT / "configs" / "vit_b16_imagenet_4k.yaml")
SPAN = NodeRange(12, 16)
PROFILE = "example-ib"  # 8 GPUs per node, InfiniBand; partition gpu
MIN_WAITS_H = [0.5, 1.0, 1.0, 1.5, 2.0]  # jobs of 12 and 8 nodes: median 1 h
BUSY_16_H = [3.0, 4.0, 5.0, 6.0, 8.0]  # jobs of 16 nodes: median 5 h
QUIET_16_H = [0.5, 1.0, 13 / 12, 1.5, 2.0]  # median 1 h 5 min: 5 min more than 12 nodes wait


def sacct_rows(waits_16_h: list[float], now: datetime | None = None) -> str:
    """A partition's last two days as `sacct -X -D -a -n -P -o JobIDRaw,State,NNodes,Eligible,Start,End,
    ElapsedRaw` prints them: each job eligible, started after its wait, 2 h of running; one 16-node job
    lost a node (NODE_FAIL) after 1 h."""
    now = now or datetime.now().replace(microsecond=0)
    lines = []
    jobs = [(12 if i % 2 else 8, w) for i, w in enumerate(MIN_WAITS_H)] + [(16, w) for w in waits_16_h]
    for i, (nodes, wait_h) in enumerate(jobs):
        eligible = now - timedelta(hours=40 - 3 * i)
        start = eligible + timedelta(hours=wait_h)
        run_s = 3600 if i == len(jobs) - 1 else 7200
        state = "NODE_FAIL" if i == len(jobs) - 1 else "COMPLETED"
        end = start + timedelta(seconds=run_s)
        lines.append(
            f"{100 + i}|{state}|{nodes}|{eligible:%Y-%m-%dT%H:%M:%S}|{start:%Y-%m-%dT%H:%M:%S}|"
            f"{end:%Y-%m-%dT%H:%M:%S}|{run_s}"
        )
    return "\n".join(lines) + "\n"


def context(waits_16_h: list[float], idle: int = 2) -> Context:
    """What read_context makes of that history, with sinfo's 40 allocated / `idle` idle of 48 nodes."""
    profile = load_profile(PROFILE)
    hist = History("gpu", 7.0, tuple(parse_sacct(sacct_rows(waits_16_h))))
    now = Now(48 - idle - 6, idle, 6, 48, ())
    return Context("gpu", hist, now, node_rate(hist, profile), None)


def range_plan(ctx: Context, span: NodeRange = SPAN, gpu_mem_gb: float | None = None):
    cfg, profile = load(RECIPE), load_profile(PROFILE)
    inputs = planmod.resolve(cfg, profile, span.hi, 8)
    return ranges.plan_range(cfg, profile, inputs, ctx, span, gpu_mem_gb)


def test_range_and_fixed_rows_for_the_4k_recipe_on_a_busy_partition():
    cfg, profile = load(RECIPE), load_profile(PROFILE)
    ctx = context(BUSY_16_H)
    rp = range_plan(ctx)
    flex, fixed = rp.options
    # the range: trained on 12 nodes (2 idle now: it waits), the busiest rank's batch ceil(4096 / 96) = 43
    assert (flex.name, flex.nodes, flex.gpus, flex.per_gpu_batch, flex.accum) == ("12-16", 12, 96, 43, 1)
    assert not rp.starts_now and flex.queue.seconds == statistics.median(MIN_WAITS_H) * 3600 == 3600
    assert flex.queue.source.startswith(
        "as a job of 12 nodes, the fewest it starts with: median of 5 jobs of 8-15 nodes that started "
        "(sacct, partition gpu, last 7 days)"
    ), flex.queue.source
    # its step is the 43-image rank's (the model's compute: images × FLOPs per image / FLOP/s)
    inputs = planmod.resolve(cfg, profile, 16, 8)
    work = planmod.workload(cfg, inputs.images_per_epoch)
    step = rp.flex.train_s / work.total_steps
    assert step > 43 * work.train_flops_per_image / (inputs.compute.tflops * 1e12)
    assert flex.images_per_s == pytest.approx(4096 / step)
    # the fixed 16 is `plan --nodes 16`'s row of 16 nodes, figure for figure
    today = next(o for o in options(cfg, profile, planmod.build(cfg, inputs), ctx, 8) if o.nodes == 16)
    assert fixed == today and fixed.per_gpu_batch == 32 and fixed.queue.seconds == 5 * 3600
    # the range waits 4 h less and trains ~1/3 longer (43 images per GPU against 32)
    assert fixed.train_s * 1.30 < flex.train_s < fixed.train_s * 43 / 32 * 1.01
    assert flex.loss.seconds is not None and fixed.loss.seconds is not None
    assert rp.best.total_s == pytest.approx(fixed.train_s)  # the best case: all 16
    rec, why = ranges.choose(rp.options)
    assert rec is flex and flex.result_s < fixed.result_s
    assert why.startswith(
        f"the range 12-16 pays: it waits 4.0 h less for 12 nodes than a fixed 16 does, and 12 nodes train "
        f"{dur(flex.train_s - fixed.train_s)} longer"
    ), why
    assert why.endswith(f"done in {dur(flex.result_s)} vs {dur(fixed.result_s)}"), why
    assert ranges.to_json(rp, rec)["pays"] == "range"


def test_a_fixed_16_pays_when_it_waits_little_longer_than_12_nodes():
    rp = range_plan(context(QUIET_16_H))
    flex, fixed = rp.options
    assert fixed.queue.seconds - flex.queue.seconds == pytest.approx(300)  # 5 min saved …
    assert flex.train_s - fixed.train_s > 600  # … against more than 10 min longer training
    rec, why = ranges.choose(rp.options)
    assert rec is fixed and fixed.result_s < flex.result_s
    assert why.startswith(
        f"a fixed 16 pays: the range 12-16 waits 5 min less for 12 nodes than a fixed 16 does, and 12 nodes "
        f"train {dur(flex.train_s - fixed.train_s)} longer"
    ), why


def test_idle_nodes_start_the_range_at_once_on_as_many_as_are_free():
    rp = range_plan(context(BUSY_16_H, idle=14))
    flex, fixed = rp.options
    assert rp.starts_now and flex.nodes == 14 and flex.name == "12-16" and flex.queue.seconds == 0
    assert (
        flex.queue.source
        == "none: sinfo shows 14 idle nodes now, at least 12: it starts at once, on 14 (min(idle, 16))"
    )
    assert flex.per_gpu_batch == math.ceil(4096 / 112) == 37
    assert fixed.queue.seconds == 5 * 3600  # 14 idle are not 16: the fixed job waits as its history says
    assert ranges.choose(rp.options)[1].startswith("the range 12-16 pays: it waits 5.0 h less for 14 nodes")
    both = range_plan(context(BUSY_16_H, idle=20))  # 16 idle or more: both start at once, on 16
    assert both.flex.nodes == both.fixed.nodes == 16 and both.fixed.queue.seconds == 0
    assert both.flex.train_s == both.fixed.train_s


def test_unknown_queue_says_what_is_missing_and_where_the_range_breaks_even():
    ctx = context(BUSY_16_H[:2])  # 2 jobs of 16 nodes: fewer than 5
    rp = range_plan(ctx)
    rec, why = ranges.choose(rp.options)
    longer = dur(rp.flex.train_s - rp.fixed.train_s)
    assert rec is None and why == (
        "unknown which pays: the queue wait of a fixed 16 is unknown: 2 jobs of 16-31 nodes that started "
        f"(sacct, partition gpu, last 7 days), fewer than 5; the range pays when it waits more than {longer} "
        "less than a fixed 16 (12 nodes train that much longer)"
    )


def test_accumulation_is_the_tasks_own_where_the_busiest_rank_would_not_fit():
    cfg = load(RECIPE)
    at_80 = ranges.fit(cfg, 1, 8)  # 512 images per GPU
    assert ranges.DEFAULT_GPU_MEM_GB == DEFAULT_GPU_MEM_GB  # submit's check's default
    assert (at_80.per_gpu, at_80.accum, at_80.fits) == (512, 1, True)
    small = ranges.fit(cfg, 1, 8, gpu_mem_gb=24)
    assert small.fits and small.accum > 1 and small.per_gpu == 512 // small.accum
    assert memory.estimate(cfg, small.per_gpu, 8).total <= 24 * memory.GB
    assert memory.estimate(cfg, small.per_gpu * 2, 8).total > 24 * memory.GB  # the accum before did not fit
    odd = ranges.fit(cfg, 12, 8, gpu_mem_gb=6)  # 43 per GPU needs ~7.8 GB
    assert (
        (odd.per_gpu, odd.accum)
        == (
            22,
            2,
        )
        and "22 per GPU (ceil of 4096 / 96 GPUs / accum 2: some ranks take one fewer), accum 2 (the recipe's 1"
        in odd.text()
    )
    rp = range_plan(context(BUSY_16_H), gpu_mem_gb=6)
    assert (rp.flex.per_gpu_batch, rp.flex.accum) == (22, 2)
    none = range_plan(context(BUSY_16_H), gpu_mem_gb=1)  # not even one image fits
    assert (
        none.flex.excluded.endswith("and no accumulation fits (memory estimate)")
        and ranges.choose(none.options)[0] is None
    )


def test_nodes_parses_counts_lists_and_ranges():
    assert node_list("16") == [16] and node_list("4,8,16") == [4, 8, 16]
    assert node_list("12-16") == NodeRange(12, 16) and node_list(" 12 - 16 ") == NodeRange(12, 16)
    for bad, why in (
        ("16-12", "MIN is above MAX; use --nodes 12-16"),
        ("0-4", "a job needs at least one node"),
        ("4-x", "give a node count (16) or a range MIN-MAX (12-16)"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(why)):
            node_list(bad)
    with pytest.raises(ValueError):
        node_list("4,12-16")  # a list of ranges is not a thing
    r = hpctrain("plan", "--config", RECIPE, "--nodes", "16-12")
    assert r.returncode == 2
    assert r.stderr.endswith("error: argument --nodes: --nodes='16-12': MIN is above MAX; use --nodes 12-16\n")


def slurm_stand_ins(bin_dir: Path, waits_16_h: list[float], idle: int = 2) -> dict[str, str]:
    """sacct printing the history, sinfo the partition, squeue no pending job; the environment that puts
    them first on PATH with an empty user cache (the `slurm` fixture's, for a subprocess)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "env").symlink_to("/usr/bin/env")
    (bin_dir / "history").write_text(sacct_rows(waits_16_h))
    fake(bin_dir, "scontrol", f'[ "$1 $2" = "show config" ] && printf "{CONFIG}"; exit 0')
    fake(bin_dir, "sacct", f'cat "{bin_dir}/history"')
    fake(bin_dir, "sinfo", f"echo {46 - idle}/{idle}/2/48")
    fake(bin_dir, "squeue", "exit 0")
    return {
        "PATH": str(bin_dir),
        "XDG_CACHE_HOME": str(bin_dir.parent / "cache"),
        "SLURM_CONF": str(bin_dir.parent / "no-slurm.conf"),
        "SLURM_JOB_ID": "",
    }


def test_plan_nodes_12_16_prints_the_two_rows_and_the_recommendation(tmp_path):
    env = slurm_stand_ins(tmp_path / "bin", BUSY_16_H)
    args = ("plan", "--config", RECIPE, "--nodes", "12-16", "--cluster", PROFILE)
    r = hpctrain(*args, env=env)
    assert r.returncode == 0, r.stderr
    text = r.stdout[r.stdout.index("time to result (partition gpu):") :]
    rows = text.splitlines()[2:4]
    assert rows[0].split()[:4] == ["12-16", "96", "43", "1"] and rows[0].split()[8:10] == ["60", "min"], rows
    assert rows[1].split()[:4] == ["16", "128", "32", "1"] and rows[1].split()[8:10] == ["5.0", "h"], rows
    assert (
        "  queue at 12-16 node(s): as a job of 12 nodes, the fewest it starts with: median of 5 jobs of 8-15 nodes"
        in text
    )
    assert (
        "  train at 12-16 node(s): on 12 nodes, the fewest Slurm starts it with: the size it can be sure of; 43 per GPU"
        in text
    )
    assert (
        "recommend: the range 12-16 pays: it waits 4.0 h less for 12 nodes than a fixed 16 does, and 12 nodes" in text
    )
    out = json.loads(hpctrain(*args, "--json", env=env).stdout)
    flex, fixed = out["options"]
    assert (flex["lo"], flex["hi"], flex["nodes"], flex["per_gpu_batch"], flex["accum"]) == (12, 16, 12, 43, 1)
    assert (fixed["lo"], fixed["hi"], fixed["queue_s"]) == (16, 16, 5 * 3600) and flex["queue_s"] == 3600
    assert out["range"]["pays"] == "range" and out["range"]["trains_on"] == 12
    assert out["range"]["best_case"]["train_s"] == pytest.approx(fixed["train_s"])
    assert out["recommend"]["name"] == "12-16" and out["recommend"]["reason"].startswith("the range 12-16 pays")
    quiet = json.loads(hpctrain(*args, "--json", env=slurm_stand_ins(tmp_path / "q" / "bin", QUIET_16_H)).stdout)
    assert quiet["range"]["pays"] == "fixed" and quiet["recommend"]["reason"].startswith("a fixed 16 pays")

"""What a checkpoint costs a job, resolved at submission (login node, no torch): the interruption
rate that `ckpt.every: auto` needs, and whether a stop has time to save.

The task has no Slurm client (docs/architecture.md), so `hpctrain submit` reads the partition's history here
and hands the job its MTBF as `ckpt.mtbf_h` (and where it came from, which the batch script exports for env.json).
Sources, best first: the config's own ckpt.mtbf_h; the profile's slurm.node_mtbf_hours; the
partition's `sacct` history over slurm.mtbf_window_days (`-X` allocations, `-D` every attempt of a
requeued job, `-a` all users, `-r` the partition: PREEMPTED and NODE_FAIL allocations per
node-hour of all its allocations, sacct(1)); else ckpt_interval.DEFAULT_MTBF_H. A per-node
figure is divided by the job's node count: any of its nodes interrupts it. The history is
cached per (cluster: ClusterName and its controller's host and port, slurm_cli.cluster_key;
partition; window) for HISTORY_TTL_S in the user's cache (site/user_cache.py), so a submission does not put the same
slurmdbd query to the site each time; the source line then says when it was read.

Only what the partition does to a job counts: TIMEOUT ("terminated upon reaching its time limit",
sacct(1) JOB STATE CODES) is the job's own limit, a planned stop that the batch shell checkpoints on
USR2 `slurm.signal_lead_s` before it, so it is no failure and must not shorten the interval.

The stop check: a stop (USR2 `slurm.signal_lead_s` before the time limit; SIGTERM `GraceTime`
before SIGKILL on a partition that preempts by REQUEUE or CANCEL, `scontrol show partition -o`)
must leave two steps (the step in flight, and the one the ranks agree to stop after) plus a save;
with the agreement every K steps (dist.stop_every, plan.stop_cost) 2K steps: the signal may come
just after a round was posted, is posted with the next one K steps on and read K steps after that.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.ckpt_interval import DEFAULT_MTBF_H
from hpctrain.config import Config
from hpctrain.errors import UserError
from hpctrain.memory import checkpoint_bytes
from hpctrain.plan import throughput
from hpctrain.plan.queue import HISTORY_CACHE_S
from hpctrain.run.layout import METRICS
from hpctrain.run.metrics import read_metrics
from hpctrain.site import user_cache
from hpctrain.site.slurm_cli import Alloc, cluster_key, partition_record, read_history

# sacct's job states (sacct(1), JOB STATE CODES) that interrupt a job, and what they are called here
INTERRUPTIONS = {"PREEMPTED": "preemptions", "NODE_FAIL": "node failures"}
# How long a partition's history is reused: a 30-day window's counts move little in half a day,
# and a submission should not cost the site's slurmdbd a month of every user's jobs each time.
HISTORY_TTL_S = 12 * 3600


@dataclass(frozen=True)
class History:
    """A partition's allocations over a window, from sacct."""

    partition: str
    days: float
    node_hours: float
    counts: dict[str, int] = field(default_factory=dict)  # INTERRUPTIONS state → allocations ending so

    @property
    def interruptions(self) -> int:
        return sum(self.counts.values())

    def node_mtbf_h(self) -> float | None:
        """Node-hours per interruption (no interruption: the node-hours, a lower bound); None: no history."""
        if self.node_hours <= 0:
            return None
        return self.node_hours / max(1, self.interruptions)

    @classmethod
    def of(cls, allocs: Iterable[Alloc], partition: str, days: float) -> History:
        """The interruptions and node-hours of sacct's allocations (slurm_cli.read_history)."""
        node_s, counts = 0.0, {s: 0 for s in INTERRUPTIONS}
        for a in allocs:
            node_s += a.nodes * a.elapsed_s
            if a.state in counts:
                counts[a.state] += 1
        return cls(partition, days, node_s / 3600.0, counts)

    def text(self) -> str:
        counts = ", ".join(f"{self.counts.get(s, 0)} {what}" for s, what in INTERRUPTIONS.items())
        return (
            f"sacct: partition {self.partition}, last {self.days:g} days: {counts} in {self.node_hours:.3g} node-hours"
        )


def partition_history(partition: str, days: float) -> tuple[History | None, str]:
    """The partition's History over `days` (None: sacct does not answer), and "" when just read or
    " (cached at <time>)" when it came from the user's cache (HISTORY_TTL_S); a fresh one is cached."""
    cluster = cluster_key()  # its name and the controller this client talks to
    name = user_cache.entry_name("sacct-history", *cluster, partition, repr(days), "+".join(INTERRUPTIONS))
    cached = user_cache.read(name, HISTORY_TTL_S)
    if cached:
        try:
            hist = History(**cached[0])
        except TypeError:
            hist = None
        if hist and isinstance(hist.node_hours, (int, float)) and isinstance(hist.counts, dict):
            at = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(cached[1]))
            return hist, f" (cached at {at}, reused for {HISTORY_TTL_S // 3600} h)"
    allocs = read_history(partition, days, cache_s=HISTORY_CACHE_S)  # the scan the queue's week reads too
    if allocs is None:
        return None, ""
    hist = History.of(allocs, partition, days)
    user_cache.write(name, dataclasses.asdict(hist))
    return hist, ""


def mtbf_scan_days(cfg: Config, profile) -> float:
    """The sacct window job_mtbf scans for this job; 0 when it scans none (a fixed interval, an MTBF
    given in the config or the profile)."""
    if cfg.ckpt.every != "auto" or cfg.ckpt.mtbf_h > 0 or profile.slurm.node_mtbf_hours > 0:
        return 0
    return profile.slurm.mtbf_window_days


def job_mtbf(cfg: Config, profile, partition: str, nodes: int) -> tuple[float, str]:
    """(the job's MTBF in hours, where it came from) for ckpt.every=auto."""
    if cfg.ckpt.mtbf_h > 0:
        return cfg.ckpt.mtbf_h, "ckpt.mtbf_h"
    per = f" / {nodes} node{'s' if nodes > 1 else ''}"
    s = profile.slurm
    if s.node_mtbf_hours > 0:
        return s.node_mtbf_hours / nodes, f"slurm.node_mtbf_hours={s.node_mtbf_hours:g} (profile {profile.name}){per}"
    name = partition or partition_record("").get("PartitionName", "")
    hist, cached = partition_history(name, s.mtbf_window_days) if name else (None, "")
    node_h = hist.node_mtbf_h() if hist else None
    if hist and node_h:
        bound = "at least " if not hist.interruptions else ""
        return node_h / nodes, f"{hist.text()}{cached}: {bound}{node_h:.3g} node-hours per interruption{per}"
    why = f"no sacct history of partition {name}" if name else "no partition known"
    return DEFAULT_MTBF_H, f"default {DEFAULT_MTBF_H:g} h ({why}; set slurm.node_mtbf_hours in the profile)"


def with_mtbf(cfg: Config, profile, partition: str, nodes: int) -> tuple[Config, str, str | None]:
    """`cfg` with ckpt.mtbf_h resolved for ckpt.every=auto, where it came from (the batch script
    exports it for env.json), and the line that says so (`cfg` as it is, "" and None for a fixed interval)."""
    if cfg.ckpt.every != "auto":
        return cfg, "", None
    hours, source = job_mtbf(cfg, profile, partition, nodes)
    cfg = dataclasses.replace(cfg, ckpt=dataclasses.replace(cfg.ckpt, mtbf_h=hours))
    return (
        cfg,
        source,
        (
            f"checkpoints: ckpt.every=auto, every sqrt(2 x save time x MTBF): save time measured in the "
            f"run, job MTBF {hours:.3g} h ({source})"
        ),
    )


# --------------------------------------------------------------------------- the stop's time


def measured(run_dir: Path) -> tuple[float | None, float | None]:
    """(median step time of the last 20 train records, the newest measured save time) of an earlier
    attempt of this run, from its metrics.jsonl; None where it has none."""
    recs = read_metrics(run_dir / METRICS)
    steps = [r["step_time_s"] for r in recs if r.get("kind") == "train" and r.get("step_time_s")][-20:]
    saves = [r["save_s"] for r in recs if r.get("kind") == "ckpt_interval" and r.get("save_s")]
    return (statistics.median(steps) if steps else None), (saves[-1] if saves else None)


def planned_step_s(cfg: Config, profile, nodes: int, gpus_per_node: int) -> float | None:
    """The step time `hpctrain plan` predicts (public figures; GPU jobs only), None when it cannot."""
    if not profile.slurm.request_gpus:
        return None
    try:
        p = throughput.build(cfg, throughput.resolve(cfg, profile, nodes, gpus_per_node))
    except UserError:
        return None
    return p.target.step.step_s if p.target else None


def stop_problems(cfg: Config, profile, partition: str, nodes: int, gpus_per_node: int) -> list[str]:
    """One line per stop that cannot save in time: the time-limit signal's lead, the partition's
    GraceTime. Step time: measured by an earlier attempt of this run, else the plan's; save time:
    measured, else the checkpoint's bytes at slurm.ckpt_write_gbps."""
    step_m, save_m = measured(cfg.run_dir)
    step = step_m if step_m else planned_step_s(cfg, profile, nodes, gpus_per_node)
    step_src = "measured by this run" if step_m else "hpctrain plan's estimate"
    if save_m and not cfg.ckpt.async_save:
        save, save_src = save_m, "measured by this run"
    else:
        gb = checkpoint_bytes(cfg) / 1e9
        save, save_src = (
            gb / profile.slurm.ckpt_write_gbps,
            f"{gb:.2g} GB at slurm.ckpt_write_gbps={profile.slurm.ckpt_write_gbps:g}",
        )
    k = max(1, cfg.dist.stop_every)  # a stop waits up to 2K steps: the agreement is every K (plan.stop_cost)
    need = 2 * k * (step or 0.0) + save
    steps = f"{2 * k} x {step:.3g} s step, {step_src}" if step else "step time unknown"
    n = "two steps" if k == 1 else f"{2 * k} steps (2 x dist.stop_every={k})"
    what = f"{n} plus a save ({steps}; {save:.3g} s save, {save_src}) = {need:.0f} s"
    advise = int(math.ceil(1.5 * need / 10.0) * 10)
    out = []
    lead = profile.slurm.signal_lead_s
    if lead < need:
        out.append(
            f"the time-limit stop signal comes slurm.signal_lead_s={lead} s before the limit, less than {what}: "
            f"the last checkpoint may not be written; raise it, e.g. --cluster-set slurm.signal_lead_s={advise}"
        )
    part = partition_record(partition)
    mode, grace = part.get("PreemptMode", ""), part.get("GraceTime", "")
    if ("REQUEUE" in mode or "CANCEL" in mode) and grace.isdigit() and int(grace) < need:
        out.append(
            f"partition {part['PartitionName']} preempts (PreemptMode={mode}) with GraceTime={grace} s from "
            f"SIGTERM to SIGKILL, less than {what}: a preempted job is killed before its checkpoint is "
            f"written; ask the site for a GraceTime of at least {advise} s, or use another --partition"
        )
    return out

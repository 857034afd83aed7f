"""The work a job is expected to lose to interruptions (preemption, node failure).

Rate: the partition's PREEMPTED and NODE_FAIL allocations per node-hour of all its
allocations in the history window (the counting of `plan.ckpt_cost`, whose MTBF sets
`ckpt.every: auto`; a TIMEOUT is the job's own checkpointed stop, not counted), or the
profile's `slurm.node_mtbf_hours`; a job of N nodes is interrupted N times as often as one node.
With none seen, the node-hours are a lower bound of the MTBF and the loss an upper bound ("≤").

Loss over a training time T with job MTBF M = node MTBF / N, save time δ, checkpoint interval τ
(`ckpt.every: auto`: Young/Daly's √(2δM), ckpt_interval.py; else ckpt.every × the step time;
0: no checkpoint until the end, τ = T): the saves, T·δ/τ, plus T/M interruptions each losing on
average τ/2 of training and the requeue wait.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.ckpt_interval import young_daly_s
from hpctrain.config import Config
from hpctrain.memory import checkpoint_bytes
from hpctrain.plan import ckpt_cost
from hpctrain.plan.ckpt_cost import INTERRUPTIONS
from hpctrain.plan.queue import MIN_JOBS, Figure, History


@dataclass(frozen=True)
class Rate:
    """Node-hours per interruption on the partition (None: unknown), and where it comes from."""

    node_mtbf_h: float | None
    source: str
    upper_bound: bool = False  # no interruption seen: the loss computed from it is at most this


def node_rate(hist: History, profile, min_jobs: int = MIN_JOBS) -> Rate:
    """The partition's node MTBF: the profile's slurm.node_mtbf_hours, else the sacct history."""
    s = profile.slurm
    if s.node_mtbf_hours > 0:
        return Rate(s.node_mtbf_hours, f"slurm.node_mtbf_hours={s.node_mtbf_hours:g} (profile {profile.name})")
    if hist.allocs is None:
        return Rate(None, f"unknown: sacct does not answer for partition {hist.partition}")
    if len(hist.allocs) < min_jobs:
        return Rate(None, f"unknown: {len(hist.allocs)} allocations ({hist.text()}), fewer than {min_jobs}")
    counted = ckpt_cost.History.of(hist.allocs, hist.partition, hist.days)
    node_h, counts, seen = counted.node_hours, counted.counts, counted.interruptions
    what = ", ".join(f"{counts[s]} {name}" for s, name in INTERRUPTIONS.items())
    if node_h <= 0:
        return Rate(None, f"unknown: no node-hours in {hist.text()}")
    mtbf = node_h / max(1, seen)
    bound = "" if seen else "at least "
    return Rate(
        mtbf,
        f"{what} in {node_h:.3g} node-hours of {len(hist.allocs)} allocations ({hist.text()}): "
        f"{bound}{mtbf:.3g} node-hours per interruption",
        upper_bound=not seen,
    )


def save_s(cfg: Config, profile) -> tuple[float, str]:
    """A checkpoint's save time: its bytes at the profile's slurm.ckpt_write_gbps (as ckpt_cost does)."""
    gb = checkpoint_bytes(cfg) / 1e9
    return gb / profile.slurm.ckpt_write_gbps, f"{gb:.2g} GB at slurm.ckpt_write_gbps={profile.slurm.ckpt_write_gbps:g}"


def interval_s(cfg: Config, save: float, job_mtbf_s: float, step_s: float, train_s: float) -> tuple[float, str]:
    """The checkpoint interval in seconds of training, and the rule it follows."""
    every = cfg.ckpt.every
    if every == "auto":
        return young_daly_s(save, job_mtbf_s), "ckpt.every=auto: sqrt(2 x save x job MTBF) (Young/Daly)"
    if every:
        return every * step_s, f"ckpt.every={every} steps"
    return train_s, "ckpt.every=0: no checkpoint before the end"


@dataclass(frozen=True)
class Loss:
    """Expected seconds lost to interruptions over a job's training, and how they were counted."""

    seconds: float | None
    source: str
    interruptions: float | None = None  # expected number over the training
    upper_bound: bool = False


def expected_loss(cfg: Config, profile, rate: Rate, nodes: int, train_s: float, step_s: float, requeue: Figure) -> Loss:
    if rate.node_mtbf_h is None:
        return Loss(None, rate.source)
    job_mtbf_s = rate.node_mtbf_h * 3600.0 / nodes
    save, save_src = save_s(cfg, profile)
    tau, rule = interval_s(cfg, save, job_mtbf_s, step_s, train_s)
    tau = min(tau, train_s)
    k = train_s / job_mtbf_s
    saves = train_s / tau * save if tau > 0 else 0.0
    note = (
        "; the interval is longer than the job's MTBF: a first-order figure, the job may never finish"
        if tau > job_mtbf_s
        else ""
    )
    what = (
        f"{k:.2g} interruptions (job MTBF {job_mtbf_s / 3600:.3g} h = node MTBF / {nodes}) x (half of a "
        f"{tau / 3600:.2g} h checkpoint interval, {rule}; + requeue wait) + saves of {save:.3g} s "
        f"({save_src}); rate: {rate.source}{note}"
    )
    if not requeue.known:
        if k * tau / 2 + saves == 0:
            return Loss(0.0, what, k, rate.upper_bound)
        return Loss(None, f"unknown: requeue wait {requeue.source}; {what}", k)
    return Loss(saves + k * (tau / 2 + requeue.seconds), what + f"; requeue wait {requeue.source}", k, rate.upper_bound)

"""Time to result per node count, and the node count to ask for.

Time to result = queue wait (plan.queue) + training time (plan.throughput) + expected interruption
loss (plan.interruptions); a node count is left out of the recommendation when the partition has
fewer nodes or the job needs more than the allocation has left (plan.allocation). The
recommendation is the soonest known time to result; the reason names what made the difference.
With no queue figure at all, time to result is unknown and the table says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hpctrain.config import Config
from hpctrain.node_range import NodeRange
from hpctrain.plan.allocation import Allocation, read_allocation, share
from hpctrain.plan.interruptions import Loss, Rate, expected_loss, node_rate
from hpctrain.plan.model import Plan, Row
from hpctrain.plan.queue import (
    HISTORY_CACHE_S,
    HISTORY_DAYS,
    Figure,
    History,
    Now,
    bucket_text,
    queue_wait,
    read_now,
    requeue_wait,
    within,
)
from hpctrain.site.slurm_cli import partition_record, read_history


@dataclass(frozen=True)
class Context:
    """What the cluster says, read once for every node count; `why` non-empty: nothing was read."""

    partition: str
    history: History
    now: Now
    rate: Rate
    allocation: Allocation | None
    why: str = ""


def no_context(why: str, partition: str = "") -> Context:
    """Nothing read from the cluster, because `why`; `partition`: the one asked about, if any (the
    table's header names it, as the sources' lines do)."""
    hist = History(partition, 0, None)
    return Context(partition, hist, Now(), Rate(None, f"unknown: {why}"), None, why)


def read_context(
    profile,
    partition: str = "",
    days: float = HISTORY_DAYS,
    account: str = "",
    since: str | None = None,
    allocation: bool = True,
    scan_days: float = 0,
) -> Context:
    """The partition's history, its state now and (`allocation`) the account's allocation; each
    answer reused from the user's cache while young (plan.queue: NOW_CACHE_S, HISTORY_CACHE_S).
    `scan_days`: a longer window the same submission scans anyway (ckpt_cost.mtbf_scan_days): read
    once, and the history is its last `days`."""
    name = partition or profile.slurm.partition or partition_record("").get("PartitionName", "")
    if not name:
        return no_context("no Slurm here (scontrol names no default partition; give --partition)")
    scan = days if since else max(days, scan_days)
    hist = History(name, days, within(read_history(name, scan, since, HISTORY_CACHE_S), days))
    now = read_now(name)
    if hist.allocs is None and now.total is None:
        return no_context(f"no Slurm here (sacct and sinfo do not answer for partition {name})", name)
    alloc = read_allocation(account or profile.slurm.account) if allocation else None
    return Context(name, hist, now, node_rate(hist, profile), alloc)


@dataclass(frozen=True)
class Option:
    """One node count: its training (from the Plan) and what the cluster adds to it."""

    nodes: int  # the nodes it trains on (a range's: the size it can count on)
    gpus: int
    per_gpu_batch: int
    images_per_s: float
    efficiency: float | None
    train_s: float
    gpu_hours: float
    queue: Figure
    loss: Loss
    share: float | None
    share_source: str
    excluded: str = ""  # why this count cannot be recommended ("" : it can)
    accum: int = 1  # micro-batches per optimizer step
    span: NodeRange | None = None  # asked as a range (--nodes 12-16); None: a fixed count

    @property
    def name(self) -> str:
        return str(self.span) if self.span else str(self.nodes)

    @property
    def result_s(self) -> float | None:
        if self.excluded or not self.queue.known or self.loss.seconds is None:
            return None
        return self.queue.seconds + self.train_s + self.loss.seconds


def option(
    cfg: Config,
    profile,
    row: Row,
    ctx: Context,
    gpus_per_node: int,
    queue: Figure | None = None,
    loss_nodes: int = 0,
    accum: int = 0,
    span: NodeRange | None = None,
) -> Option:
    """The row's time to result; `queue`: its wait when not the history's for its size, `loss_nodes`:
    the size whose requeue wait an interruption costs (default: its own)."""
    st, n = row.step, row.step.nodes
    if ctx.why:
        q = Figure(None, f"unknown: {ctx.why}")
    elif ctx.now.total is not None and min(n, loss_nodes or n) > ctx.now.total:
        q = Figure(None, f"never: partition {ctx.partition} has only {ctx.now.total} nodes (sinfo)")
    else:
        q = queue or queue_wait(ctx.history, n)
    requeue = requeue_wait(ctx.history, loss_nodes or n)
    loss = expected_loss(cfg, profile, ctx.rate, n, row.total_s, st.step_s, requeue)
    if ctx.why:
        frac, how = None, f"unknown: {ctx.why}"
    else:
        frac, how = share(ctx.allocation, n, gpus_per_node, profile.slurm.cpus_per_node, row.total_s / 3600)
    excluded = q.source if q.source.startswith("never") else ""
    if frac is not None and frac > 1 and not excluded:
        excluded = f"needs {100 * frac:.0f}% of the allocation left ({how})"
    return Option(
        n,
        st.gpus,
        st.per_gpu_batch,
        st.images_per_s,
        row.efficiency,
        row.total_s,
        row.gpu_hours,
        q,
        loss,
        frac,
        how,
        excluded,
        accum or cfg.train.accum_steps,
        span,
    )


def options(cfg: Config, profile, plan: Plan, ctx: Context, gpus_per_node: int) -> list[Option]:
    return [option(cfg, profile, r, ctx, gpus_per_node) for r in plan.rows]


def dur(s: float | None, approx: bool = False) -> str:
    if s is None:
        return "unknown"
    t = f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 2 * 3600 else f"{s / 3600:.1f} h"
    return ("~" if approx else "") + t


def recommend(opts: list[Option]) -> tuple[Option | None, str]:
    """(the node count to ask for, the reason in one sentence)."""
    ok = [o for o in opts if not o.excluded]
    known = [o for o in ok if o.result_s is not None]
    if not ok:
        return None, "none of these node counts can run: " + "; ".join(
            f"{counts}: {why}" for why, counts in _grouped(opts, lambda o: o.excluded)
        )
    if not known:
        o = min(ok, key=lambda o: o.train_s)
        why = next((x.queue.source for x in ok if not x.queue.known), "") or o.loss.source
        return o, f"{o.nodes} nodes trains soonest ({dur(o.train_s)}); time to result {why}"
    best = min(known, key=lambda o: o.result_s)
    fastest = min(ok, key=lambda o: o.train_s)
    parts = (
        f"train {dur(best.train_s)} + queue {dur(best.queue.seconds)} + interruptions "
        f"{'≤' if best.loss.upper_bound else ''}{dur(best.loss.seconds)}"
    )
    if fastest is best:
        return best, f"{best.nodes} nodes: done soonest, in {dur(best.result_s)} ({parts})"
    if fastest.result_s is None:
        return best, (
            f"{best.nodes} nodes: done in {dur(best.result_s)} ({parts}); {fastest.nodes} trains in "
            f"{dur(fastest.train_s)} but its time to result is unknown ({fastest.queue.source})"
        )
    dq = fastest.queue.seconds - best.queue.seconds
    dl = fastest.loss.seconds - best.loss.seconds
    what = (
        f"waits {dur(fastest.queue.seconds, True)} in the queue ({fastest.queue.source})"
        if dq >= dl
        else f"loses {dur(fastest.loss.seconds, True)} to interruptions"
    )
    return best, (
        f"{best.nodes} nodes: done in {dur(best.result_s)} vs {dur(fastest.result_s)} for {fastest.nodes}, which {what}"
    )


def _share(o: Option) -> str:
    return "-" if o.share is None else "over" if o.share == float("inf") else f"{100 * o.share:.1f}%"


def _grouped(opts: list[Option], key) -> list[tuple[str, str]]:
    """(source, "4,8") pairs: node counts whose figure has the same source share one line."""
    out: dict[str, list[str]] = {}
    for o in opts:
        out.setdefault(key(o), []).append(o.name)
    sep = " and " if any(o.span for o in opts) else ","  # "12-16 and 16", not "12-16,16"
    return [(src, sep.join(ns)) for src, ns in out.items()]


Chooser = Callable[[list[Option]], tuple[Option | None, str]]


def table(opts: list[Option], ctx: Context, withheld: str = "", choose: Chooser | None = None) -> list[str]:
    """The time-to-result table, the sources of its figures and the recommendation (none, saying
    `withheld`, when the figures are not the cluster's; `choose`: another rule than `recommend`, a node
    range's: plan.ranges)."""
    where = f"partition {ctx.partition}" if ctx.partition else "no partition"
    spans = any(o.span for o in opts)  # a node range: its name is wider, and its accumulation shown
    w = max([5] + [len(o.name) for o in opts])
    lines = [
        f"time to result ({where}):",
        f"  {'nodes':>{w}} {'GPUs':>5} {'per GPU':>7}"
        + (f" {'accum':>5}" if spans else "")
        + f" {'images/s':>10} {'eff.':>6} {'train':>9} {'queue':>9} "
        f"{'interr.':>9} {'result':>9} {'GPU-h':>8} {'alloc.':>7}",
    ]
    for o in opts:
        eff = f"{100 * o.efficiency:.1f}%" if o.efficiency is not None else "-"
        loss = ("≤" if o.loss.upper_bound else "") + dur(o.loss.seconds)
        queue = "never" if o.excluded.startswith("never") else dur(o.queue.seconds)
        lines.append(
            f"  {o.name:>{w}} {o.gpus:>5} {o.per_gpu_batch:>7}"
            + (f" {o.accum:>5}" if spans else "")
            + f" {o.images_per_s:>10.0f} {eff:>6} "
            f"{dur(o.train_s):>9} {queue:>9} {loss:>9} {dur(o.result_s):>9} {o.gpu_hours:>8.0f} "
            f"{_share(o):>7}"
        )
    lines.append("sources:")
    lines.append("  train: hpctrain plan's step model (above)")
    for what, key in (
        ("queue", lambda o: o.queue.source),
        ("interruptions", lambda o: o.loss.source),
        ("allocation share", lambda o: o.share_source),
    ):
        for src, counts in _grouped(opts, key):
            lines.append(f"  {what} at {counts} node(s): {src}")
    alloc = ctx.allocation.text() if ctx.allocation else f"unknown: {ctx.why or 'sshare does not answer'}"
    lines.append(f"  account: {alloc}")
    if not ctx.why:
        lines.append(f"  now: {ctx.now.text(opts[0].nodes if opts else 1)}")
    lines.append(f"recommend: {'none: ' + withheld if withheld else (choose or recommend)(opts)[1]}")
    return lines


def to_json(opts: list[Option], ctx: Context, withheld: str = "", choose: Chooser | None = None) -> dict:
    rec, why = (None, f"none: {withheld}") if withheld else (choose or recommend)(opts)
    now = ctx.now
    return {
        "partition": ctx.partition or None,
        "history_days": ctx.history.days,
        "unknown_because": ctx.why or None,
        "now": {
            "allocated": now.allocated,
            "idle": now.idle,
            "other": now.other,
            "total": now.total,
            "pending": None
            if now.pending is None
            else [{"nodes": n, "expected_start": s.isoformat() if s else None} for n, s in now.pending],
        },
        "allocation": None
        if ctx.allocation is None
        else {
            "account": ctx.allocation.account,
            "user": ctx.allocation.user,
            "raw_usage": ctx.allocation.raw_usage,
            "fairshare": ctx.allocation.fairshare,
            "grp_tres_mins": ctx.allocation.limit,
            "limit_of": ctx.allocation.limit_of,
            "used_mins": ctx.allocation.used,
            "running_mins": ctx.allocation.running,
        },
        "options": [
            {
                "nodes": o.nodes,
                "gpus": o.gpus,
                "lo": o.span.lo if o.span else o.nodes,
                "hi": o.span.hi if o.span else o.nodes,
                "per_gpu_batch": o.per_gpu_batch,
                "accum": o.accum,
                "images_per_s": o.images_per_s,
                "efficiency": o.efficiency,
                "train_s": o.train_s,
                "queue_s": o.queue.seconds,
                "queue_source": o.queue.source,
                "queue_jobs": o.queue.n,
                "interruption_loss_s": o.loss.seconds,
                "interruption_source": o.loss.source,
                "interruptions": o.loss.interruptions,
                "loss_upper_bound": o.loss.upper_bound,
                "result_s": o.result_s,
                "gpu_hours": o.gpu_hours,
                "allocation_share": o.share,
                "allocation_source": o.share_source,
                "excluded": o.excluded or None,
            }
            for o in opts
        ],
        "recommend": {"nodes": rec.nodes if rec else None, "name": rec.name if rec else None, "reason": why},
    }


def one_line(o: Option | None, ctx: Context, nodes: int) -> str:
    """`hpctrain submit`'s line for the request it submits."""
    if o is None:
        return queue_line(ctx, nodes)
    share_txt = f", {_share(o)} of the allocation left" if o.share is not None else ""
    loss = ("≤" if o.loss.upper_bound else "") + dur(o.loss.seconds)
    if ctx.why:
        return (
            f"time to result: unknown ({ctx.why}); {o.nodes} node(s): train {dur(o.train_s)}, "
            f"{o.gpu_hours:,.0f} GPU-hours"
        )
    return (
        f"time to result: {o.nodes} node(s) on partition {ctx.partition}: queue {dur(o.queue.seconds)} "
        f"({o.queue.source}) + train {dur(o.train_s)} + interruptions {loss} = {dur(o.result_s)}; "
        f"{o.gpu_hours:,.0f} GPU-hours{share_txt}"
    )


def prediction(o: Option | None, ctx: Context, nodes: int) -> dict:
    """What the plan predicts for the request it submits, stored in the run (`plan.json`) for the goodput
    ledger's plan vs reality: queue wait, and for a GPU job images/s, training, interruptions and time to
    result. A figure the plan does not have is None, with why in its source."""
    q = queue_wait(ctx.history, nodes) if not ctx.why else None
    out: dict = {
        "nodes": nodes,
        "partition": ctx.partition,
        "queue_s": q.seconds if q else None,
        "queue_source": q.source if q else f"unknown ({ctx.why})",
        "images_per_s": None,
        "train_s": None,
        "interruptions": None,
        "loss_s": None,
        "result_s": None,
        "model_source": "no step model for this job (a CPU job, or no training-time figure)",
    }
    if o is not None:
        out.update(
            images_per_s=o.images_per_s,
            train_s=o.train_s,
            interruptions=o.loss.interruptions,
            loss_s=o.loss.seconds,
            result_s=o.result_s,
            model_source=f"hpctrain plan's step model; interruptions: {o.loss.source}",
        )
    return out


def queue_line(ctx: Context, nodes: int) -> str:
    """The queue alone (a CPU job, or no training-time model): its wait and the partition now."""
    if ctx.why:
        return f"queue: unknown ({ctx.why})"
    if ctx.now.total is not None and nodes > ctx.now.total:
        return f"queue: never: partition {ctx.partition} has only {ctx.now.total} nodes (sinfo)"
    q = queue_wait(ctx.history, nodes)
    return f"queue: {nodes} node(s) ({bucket_text(nodes)}) on partition {ctx.partition}: {dur(q.seconds)} ({q.source})"

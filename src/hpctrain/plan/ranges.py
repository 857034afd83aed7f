"""`hpctrain plan --nodes 12-16`: a node range against a fixed MAX, and which of them pays.

Slurm starts a range as soon as MIN nodes are free and gives it up to MAX (node_range.py); the
training keeps the global batch at whatever size it got. So the range's row is:

- queue: none when sinfo shows at least MIN idle nodes now (it starts at once, on min(idle, MAX));
  else the history's wait for a job of MIN nodes (its power-of-two class, plan.queue);
- training: at the size it starts on now, else at MIN, the size it can be sure of (MAX is the best
  case, named in the sources); the per-GPU batch is the busiest rank's, ceil(global / GPUs), with
  the accumulation the tasks take where it would not fit the GPU's memory (memory.fit_accum);
- interruptions: at that size, each costing a requeue wait of a job of MIN nodes.

The fixed row is MAX nodes as for `--nodes MAX`, but also starts at once when MAX nodes are idle (the
two rows then compare the same moment). The range pays when the queue wait it saves is more than the
longer training (and interruptions) of the fewer nodes: time to result decides, and the reason says
both in numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hpctrain import memory
from hpctrain.config import Config
from hpctrain.node_range import NodeRange
from hpctrain.plan.model import Row, step_time, uneven_step_time
from hpctrain.plan.queue import Figure, queue_wait
from hpctrain.plan.recommend import Context, Option, dur, option
from hpctrain.plan.throughput import PlanInputs, workload

# one GPU's memory when none is given: submit's batch check's (launch/batch.py, a layer above plan;
# a test keeps the two equal)
DEFAULT_GPU_MEM_GB = 80.0


@dataclass(frozen=True)
class Fit:
    """The busiest rank's micro-batch at a node count, and the accumulation that makes it fit."""

    nodes: int
    gpus: int
    global_batch: int
    per_gpu: int  # ceil(global / (GPUs × accum)): the busiest rank's images per micro-step
    accum: int
    need_bytes: int  # memory.estimate's total per GPU at per_gpu
    cap_bytes: int  # one GPU's memory
    recipe_accum: int

    @property
    def fits(self) -> bool:
        return self.need_bytes <= self.cap_bytes

    def text(self) -> str:
        split = f"{self.global_batch} / {self.gpus} GPUs" + (f" / accum {self.accum}" if self.accum > 1 else "")
        if self.global_batch % (self.gpus * self.accum):
            split = f"ceil of {split}: some ranks take one fewer"
        doubled = f" (the recipe's {self.recipe_accum} would not fit)" if self.accum != self.recipe_accum else ""
        return (
            f"{self.per_gpu} per GPU ({split}), accum {self.accum}{doubled}: {memory.gb(self.need_bytes)} of "
            f"{memory.gb(self.cap_bytes)} per GPU (memory estimate)"
        )


def fit(cfg: Config, nodes: int, gpus_per_node: int, gpu_mem_gb: float | None = None) -> Fit:
    """The accumulation the tasks will take at this size (memory.fit_accum: the recipe's, raised to
    the next divisor of the global batch until the busiest rank's micro-batch fits the GPU); `fits`
    False when nothing does (the row is then excluded)."""
    cap = int((DEFAULT_GPU_MEM_GB if gpu_mem_gb is None else gpu_mem_gb) * memory.GB)
    gpus, g = nodes * gpus_per_node, cfg.data.global_batch
    accum = memory.fit_accum(cfg, gpus, cap)
    b = -(-g // (gpus * accum))
    return Fit(nodes, gpus, g, b, accum, memory.estimate(cfg, b, gpus).total, cap, cfg.train.accum_steps)


def row_at(cfg: Config, inputs: PlanInputs, nodes: int, accum: int) -> Row:
    """The training at `nodes` with `accum` micro-steps, the batch split unevenly where it must be."""
    work = workload(cfg, inputs.images_per_epoch)
    gpn, c, a, b, o = inputs.gpus_per_node, inputs.compute, inputs.intra, inputs.inter, inputs.overlap
    st = uneven_step_time(work, nodes, gpn, accum, c, a, b, o)
    base = step_time(work, 1, gpn, c, a, b, o)  # the training table's 1-node row, as its efficiency's
    eff = st.images_per_s / (nodes * base.images_per_s) if base else None
    total = work.total_steps * st.step_s
    return Row(st, eff, work.steps_per_epoch * st.step_s, total, total / 3600 * st.gpus)


@dataclass(frozen=True)
class RangePlan:
    """The range's row and a fixed MAX's, with what they rest on."""

    span: NodeRange
    flex: Option  # the range, trained at flex.nodes (the size it starts on now, else MIN)
    fixed: Option  # a fixed MAX
    best: Row  # the range's best case: MAX nodes
    fits: tuple[Fit, Fit]  # at flex.nodes, at MAX
    starts_now: bool  # sinfo shows at least MIN idle nodes

    @property
    def options(self) -> list[Option]:
        return [self.flex, self.fixed]


def _idle(ctx: Context, nodes: int) -> bool:
    return not ctx.why and ctx.now.idle is not None and ctx.now.idle >= nodes


def _at_once(ctx: Context, nodes: int) -> Figure:
    return Figure(0.0, f"none: sinfo shows {ctx.now.idle} idle nodes now, at least {nodes}: it starts at once")


def plan_range(
    cfg: Config, profile, inputs: PlanInputs, ctx: Context, span: NodeRange, gpu_mem_gb: float | None = None
) -> RangePlan:
    gpn = inputs.gpus_per_node
    now = _idle(ctx, span.lo)
    n = min(ctx.now.idle or 0, span.hi) if now else span.lo
    if now:
        q = Figure(0.0, _at_once(ctx, span.lo).source + f", on {n} (min(idle, {span.hi}))")
    else:
        h = queue_wait(ctx.history, span.lo)
        q = Figure(h.seconds, f"as a job of {span.lo} nodes, the fewest it starts with: {h.source}", h.n)
    fits = (fit(cfg, n, gpn, gpu_mem_gb), fit(cfg, span.hi, gpn, gpu_mem_gb))
    rows = [row_at(cfg, inputs, f.nodes, f.accum) for f in fits]
    flex = option(cfg, profile, rows[0], ctx, gpn, q, span.lo, fits[0].accum, span)
    fixed_q = _at_once(ctx, span.hi) if _idle(ctx, span.hi) else None
    fixed = option(cfg, profile, rows[1], ctx, gpn, fixed_q, accum=fits[1].accum)
    flex, fixed = (_unfit(o, f) for o, f in zip((flex, fixed), fits))
    return RangePlan(span, flex, fixed, rows[1], fits, now)


def _unfit(o: Option, f: Fit) -> Option:
    if f.fits or o.excluded:
        return o
    why = (
        f"{f.per_gpu} images per GPU need {memory.gb(f.need_bytes)} of {memory.gb(f.cap_bytes)} and no "
        "accumulation fits (memory estimate)"
    )
    return replace(o, excluded=why)


def choose(opts: list[Option]) -> tuple[Option | None, str]:
    """The range or the fixed MAX (recommend.Chooser over RangePlan.options), and why in numbers."""
    flex, fixed = opts
    span, n = flex.span, flex.nodes
    assert span is not None
    if flex.excluded:
        return None, f"neither: the range {span} cannot run ({flex.excluded})"
    if fixed.excluded:
        return flex, f"the range {span} pays: a fixed {span.hi} cannot run ({fixed.excluded})"
    longer = flex.train_s - fixed.train_s
    trains = f"{n} nodes train {dur(longer)} longer" if n < fixed.nodes else f"it trains on {n} nodes too"
    if not (flex.queue.known and fixed.queue.known):
        missing = "; ".join(
            f"the queue wait {what} is {o.queue.source}"
            for what, o in ((f"of the range ({n} nodes)", flex), (f"of a fixed {span.hi}", fixed))
            if not o.queue.known
        )
        if flex.queue.source == fixed.queue.source:  # e.g. no Slurm here: said once
            missing = f"the queue waits are {flex.queue.source}"
        return None, (
            f"unknown which pays: {missing}; the range pays when it waits more than {dur(longer)} less "
            f"than a fixed {span.hi} ({n} nodes train that much longer)"
        )
    qa, qb = flex.queue.seconds or 0.0, fixed.queue.seconds or 0.0  # both known here
    saved = qb - qa
    waits = (
        f"waits {dur(saved)} less for {n} nodes than a fixed {span.hi} does"
        if saved > 0
        else f"waits no less than a fixed {span.hi} ({dur(qa)} vs {dur(qb)})"
    )
    ra, rb, la, lb = flex.result_s, fixed.result_s, flex.loss.seconds, fixed.loss.seconds
    if ra is None or rb is None or la is None or lb is None:
        missing = next(o.loss.source for o in (flex, fixed) if o.loss.seconds is None)
        pays = saved > longer
        head = f"the range {span} pays" if pays else f"a fixed {span.hi} pays"
        return flex if pays else fixed, (
            f"{head} on queue and training alone: the range {waits}, and {trains}; interruptions {missing}"
        )
    loss = f"; interruptions {dur(la)} vs {dur(lb)}" if abs(la - lb) >= 0.01 * rb else ""
    if ra < rb:
        return flex, f"the range {span} pays: it {waits}, and {trains}{loss}: done in {dur(ra)} vs {dur(rb)}"
    return fixed, (
        f"a fixed {span.hi} pays: the range {span} {waits}, and {trains}{loss}: done in {dur(rb)} vs {dur(ra)}"
    )


def source_lines(rp: RangePlan) -> list[str]:
    """What the two rows' training rests on (`sources:` lines, after the table's `train:`)."""
    s, f0, f1 = rp.span, *rp.fits
    size = (
        f"the size it starts on now (sinfo's idle nodes, at most {s.hi})"
        if rp.starts_now
        else "the fewest Slurm starts it with: the size it can be sure of"
    )
    return [
        f"  train at {s} node(s): on {f0.nodes} nodes, {size}; {f0.text()}; "
        f"best case {s.hi} nodes: {dur(rp.best.total_s)}",
        f"  train at {s.hi} node(s): {f1.text()}",
    ]


def to_json(rp: RangePlan, choice: Option | None) -> dict:
    """`plan --json`'s `range` object (the rows themselves are its `options`, with lo/hi)."""
    return {
        "lo": rp.span.lo,
        "hi": rp.span.hi,
        "trains_on": rp.flex.nodes,
        "starts_now": rp.starts_now,
        "best_case": {"nodes": rp.span.hi, "train_s": rp.best.total_s},
        "fit": [
            {"nodes": f.nodes, "per_gpu_batch": f.per_gpu, "accum": f.accum, "memory_bytes": f.need_bytes}
            for f in rp.fits
        ],
        "gpu_memory_bytes": rp.fits[0].cap_bytes,
        "pays": None if choice is None else "range" if choice is rp.flex else "fixed",
    }

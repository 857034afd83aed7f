"""`hpctrain plan`'s training-time printout: the node-count table, the assumptions behind it, its
JSON form, and the few lines `submit --dry-run` prints."""

from __future__ import annotations

import math
from dataclasses import asdict

from hpctrain.config import Config
from hpctrain.plan.model import Plan
from hpctrain.plan.throughput import PlanInputs, build, resolve


def _dur(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 2 * 3600:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def assumptions(cfg: Config, inputs: PlanInputs, plan: Plan) -> list[str]:
    w = plan.work
    grad_dtype = getattr(cfg.train, "grad_reduce_dtype", "fp32")
    return [
        f"compute: {inputs.compute.tflops:.1f} TFLOP/s per GPU achieved ({inputs.compute.source}); "
        f"{w.train_flops_per_image / 1e9:.1f} GFLOP per trained image; same per-image speed at every "
        "per-GPU batch (optimistic below the batch it was measured at)",
        f"all-reduce: 2(n-1)/n x {w.grad_bytes / 1e6:.0f} MB of {grad_dtype} gradients / busbw"
        + (" plus NCCL's per-call latency model (tuning.cc; the fastest of ring/tree)" if inputs.inter.nccl else "")
        + ", in "
        f"{math.ceil(w.grad_bytes / w.bucket_bytes)} bucket(s) of {cfg.dist.ddp_bucket_mb} MB; "
        f"within a node: {inputs.intra.source}; between nodes (fabric {inputs.fabric}): {inputs.inter.source}",
        (
            "overlap: DDP reduces each bucket during the backward that remains (backward = 2/3 of compute); "
            "exposed = max(one bucket, all-reduce - backward x (k-1)/k)"
            if inputs.overlap
            else "overlap: none (--no-overlap): the whole all-reduce follows the backward"
        )
        + "; contention between NCCL and compute kernels, stragglers and network congestion are not modelled",
        f"data wait: {inputs.compute.data_wait_per_image_s * 1e3:.3f} ms per image"
        + (" (none given: assumed 0)" if not inputs.compute.data_wait_per_image_s else ""),
        f"epoch: {w.images_per_epoch:,} images ({inputs.images_source}), {w.steps_per_epoch:,} steps of "
        f"{w.global_batch}; {w.total_steps:,} steps in all; evaluation, checkpoints and start-up not counted",
        "efficiency: images/s at N nodes over N x images/s of the same recipe on 1 node",
    ] + (
        [
            "dist.parallel=fsdp: modelled as DDP; FSDP also all-gathers the weights (about 1.5x the "
            "bytes of a DDP all-reduce), so communication is under-estimated"
        ]
        if cfg.dist.parallel == "fsdp"
        else []
    )


def to_dict(cfg: Config, inputs: PlanInputs, plan: Plan) -> dict:
    def row(r) -> dict:
        st = r.step
        return {
            "nodes": st.nodes,
            "gpus": st.gpus,
            "per_gpu_batch": st.per_gpu_batch,
            "images_per_s": st.images_per_s,
            "step_s": st.step_s,
            "compute_s": st.compute_s,
            "allreduce_s": st.comm_s,
            "exposed_comm_s": st.exposed_s,
            "data_wait_s": st.data_wait_s,
            "epoch_s": r.epoch_s,
            "total_s": r.total_s,
            "gpu_hours": r.gpu_hours,
            "efficiency": r.efficiency,
        }

    return {
        "nodes": list(inputs.counts) if inputs.counts else inputs.nodes,
        "gpus_per_node": inputs.gpus_per_node,
        "global_batch": plan.work.global_batch,
        "grad_bytes": plan.work.grad_bytes,
        "train_flops_per_image": plan.work.train_flops_per_image,
        "images_per_epoch": plan.work.images_per_epoch,
        "total_steps": plan.work.total_steps,
        "target": row(plan.target) if plan.target and not inputs.counts else None,
        "rows": [row(r) for r in plan.rows],
        "skipped_node_counts": plan.skipped,
        "inputs": {**asdict(inputs)},
        "assumptions": assumptions(cfg, inputs, plan),
    }


def describe(cfg: Config, inputs: PlanInputs, plan: Plan) -> str:
    """The full printout: the target, the node-count table, the assumptions."""
    nodes = ",".join(map(str, inputs.counts)) if inputs.counts else str(inputs.nodes)
    lines = [
        f"hpctrain plan: {cfg.model.arch} {cfg.model.img_size}²/{cfg.model.patch_size}, global batch "
        f"{cfg.data.global_batch}, {nodes} node(s) x {inputs.gpus_per_node} GPUs"
    ]
    if plan.target is None and not inputs.counts:
        lines.append(
            f"  {inputs.nodes} node(s): data.global_batch={cfg.data.global_batch} does not split over "
            f"{inputs.nodes * inputs.gpus_per_node} GPUs x train.accum_steps {cfg.train.accum_steps}"
        )
    elif not inputs.counts:  # several node counts compared (--nodes 4,8,16): no one target
        lines += ["  " + ln for ln in summary_lines(plan)]
    head = (
        f"  {'nodes':>5} {'GPUs':>5} {'per GPU':>7} {'images/s':>10} {'step ms':>8} {'compute':>8} "
        f"{'comm':>7} {'exposed':>8} {'data':>6} {'epoch':>9} {'total':>9} {'GPU-h':>8} {'eff.':>6}"
    )
    lines += ["", head]
    for r in plan.rows:
        st = r.step
        eff = f"{100 * r.efficiency:.1f}%" if r.efficiency is not None else "-"
        mark = " <" if st.nodes == inputs.nodes and not inputs.counts else ""
        lines.append(
            f"  {st.nodes:>5} {st.gpus:>5} {st.per_gpu_batch:>7} {st.images_per_s:>10.0f} "
            f"{1e3 * st.step_s:>8.1f} {1e3 * st.compute_s:>8.1f} {1e3 * st.comm_s:>7.2f} "
            f"{1e3 * st.exposed_s:>8.2f} {1e3 * st.data_wait_s:>6.1f} {_dur(r.epoch_s):>9} "
            f"{_dur(r.total_s):>9} {r.gpu_hours:>8.0f} {eff:>6}{mark}"
        )
    if plan.skipped:
        lines.append(
            f"  (not shown: {', '.join(map(str, plan.skipped))} node(s), where the global batch cannot give "
            "every GPU a sample)"
        )
    lines += ["", "assumptions:"] + [f"  - {a}" for a in assumptions(cfg, inputs, plan)]
    return "\n".join(lines)


def summary_lines(plan: Plan) -> list[str]:
    """The few lines `submit --dry-run` prints."""
    r = plan.target
    st = r.step
    eff = f", {100 * r.efficiency:.1f} % of linear vs 1 node" if r.efficiency is not None else ""
    return [
        f"per-GPU batch {st.per_gpu_batch}; predicted {st.images_per_s:,.0f} images/s{eff}",
        f"step {1e3 * st.step_s:.1f} ms = compute {1e3 * st.compute_s:.1f} + exposed all-reduce "
        f"{1e3 * st.exposed_s:.2f} (of {1e3 * st.comm_s:.2f}) + data wait {1e3 * st.data_wait_s:.1f}",
        f"epoch {_dur(r.epoch_s)}, {plan.work.total_steps:,} steps {_dur(r.total_s)}, {r.gpu_hours:,.0f} GPU-hours",
    ]


def summary(cfg: Config, profile, nodes: int, gpus_per_node: int, gpu: str = "H100") -> list[str]:
    """`submit --dry-run`'s plan lines from the shipped figures (no measured inputs)."""
    inputs = resolve(cfg, profile, nodes, gpus_per_node, gpu=gpu)
    plan = build(cfg, inputs)
    if plan.target is None:
        return []
    return [f"plan ({gpu}, fabric {inputs.fabric}; public figures, `hpctrain plan` for the assumptions):"] + [
        "  " + ln for ln in summary_lines(plan)
    ]

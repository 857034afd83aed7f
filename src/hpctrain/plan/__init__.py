"""`hpctrain plan`: what a job will cost before it is submitted — per-GPU batch, images/s, the
step split into compute, exposed all-reduce and data wait, epoch and total time, GPU-hours and
scaling efficiency against one node. Torch-free: runs on login nodes.

Inputs, best first: `hpctrain bench --json` results from the target GPU (compute) and
`hpctrain doctor --allreduce --json` from the target fabric (bus bandwidth); else the public
figures of `plan.tables`. The model itself is `plan.model`; docs/plan.md states its assumptions.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpctrain import flops
from hpctrain.config import Config
from hpctrain.errors import UserError
from hpctrain.plan import tables
from hpctrain.plan.model import Compute, Link, Plan, Workload, make_plan, node_counts

__all__ = ["PlanInputs", "PlanError", "build", "describe", "summary", "to_dict"]


class PlanError(UserError):
    """An input the planner cannot use: one line with the fix."""


@dataclass(frozen=True)
class PlanInputs:
    nodes: int
    gpus_per_node: int
    compute: Compute
    intra: Link
    inter: Link
    images_per_epoch: int
    images_source: str
    fabric: str
    overlap: bool = True  # DDP overlaps all-reduce with backward (False: reduce after backward)


# --------------------------------------------------------------------------- the workload

def grad_bytes(cfg: Config) -> float:
    """Bytes DDP all-reduces per step: every trainable parameter's gradient, in fp32 (or bf16 when
    `train.grad_reduce_dtype` says so, where that key exists)."""
    width = 2 if getattr(cfg.train, "grad_reduce_dtype", "fp32") == "bf16" else 4
    return float(flops.model_params(cfg.model) * width)


def workload(cfg: Config, images_per_epoch: int) -> Workload:
    return Workload(
        train_flops_per_image=flops.model_flops(cfg.model).train_flops, grad_bytes=grad_bytes(cfg),
        bucket_bytes=cfg.train.ddp_bucket_mb * 2**20, global_batch=cfg.data.batch_size,
        accum_steps=cfg.train.accum_steps, images_per_epoch=images_per_epoch, epochs=cfg.train.epochs,
        max_steps=cfg.train.max_steps)


def images_per_epoch(cfg: Config, given: int | None = None) -> tuple[int, str]:
    """(training images per epoch, where the count comes from)."""
    from hpctrain.data.imagenet import IMAGENET

    if given:
        return given, "--images-per-epoch"
    if cfg.data.loader == "synthetic":
        return cfg.data.synthetic_size, "data.synthetic_size"
    if cfg.model.num_classes == IMAGENET["classes"]:
        return IMAGENET["train"], "ImageNet-1k train split"
    train = Path(cfg.data.root) / "train" if cfg.data.root else None
    if train and train.is_dir() and cfg.data.format == "folder":
        return sum(1 for p in train.rglob("*") if p.is_file()), f"files under {train}"
    raise PlanError(f"cannot tell how many images an epoch has ({cfg.model.num_classes} classes, data.root "
                    f"{cfg.data.root or 'unset'}): pass --images-per-epoch N")


# --------------------------------------------------------------------------- compute

def _records(path: str) -> list[dict]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise PlanError(f"cannot read {path}: {e.strerror}; give the file `hpctrain bench --json` wrote") from None
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError:  # JSON lines
        try:
            data = [json.loads(line) for line in text.splitlines() if line.strip().startswith("{")]
        except json.JSONDecodeError:
            raise PlanError(f"{path} is not JSON: give the output of `hpctrain bench --json`") from None
    if isinstance(data, dict):
        data = data.get("results", [data]) if "images_per_s" not in data else [data]
    return [r for r in data if isinstance(r, dict)]


def compute_from_bench(path: str, cfg: Config) -> Compute:
    """Achieved TFLOP/s per device from `hpctrain bench --json` (the closest record to this model)."""
    recs = [r for r in _records(path) if r.get("images_per_s_per_device") and r.get("train_gflops_per_image")
            and not str(r.get("case", "")).startswith("timm")]  # bench/gpu.sh's results.json holds timm's too
    if not recs:
        raise PlanError(f"{path} holds no `hpctrain bench --json` record (images_per_s_per_device, "
                        "train_gflops_per_image): run `hpctrain bench --config C --json > FILE` on the target GPU")
    want = flops.model_flops(cfg.model).train_flops / 1e9
    # one rank (no communication in the figure), the closest model, the config's compile setting, the fastest
    def rank(r: dict) -> tuple:
        return (r.get("world_size", 1) != 1, round(abs(math.log(r["train_gflops_per_image"] / want)), 3),
                r.get("compile", cfg.train.compile) != cfg.train.compile, -r["images_per_s_per_device"])

    r = min(recs, key=rank)
    tflops = r["images_per_s_per_device"] * r["train_gflops_per_image"] / 1e3
    step_s = r.get("step_time_ms", 0) / 1e3
    per_image_wait = r.get("data_wait", 0.0) * step_s / max(1, r.get("per_device_batch", 1) * r.get("accum_steps", 1))
    src = (f"measured: {path} ({r.get('device_name', '?')}, {r.get('arch', '?')}, batch "
           f"{r.get('per_device_batch', '?')} per device, {r.get('world_size', 1)} rank(s))")
    return Compute(tflops, src, per_image_wait)


def compute_from_table(gpu: str, cfg: Config) -> Compute:
    """The published figure for this GPU whose model is closest in FLOPs per image, as TFLOP/s."""
    figs = [f for f in tables.GPU_FIGURES if f.gpu.lower() in gpu.lower()]
    if not figs:
        known = ", ".join(sorted({f.gpu for f in tables.GPU_FIGURES}))
        raise PlanError(f"no public training figure for GPU {gpu!r} (known: {known}): run `hpctrain bench "
                        "--json` on it and pass --bench-results FILE, or give --tflops X")
    want = flops.model_flops(cfg.model).train_flops

    def fig_flops(f: tables.GpuFigure) -> float:
        return 6.0 * flops.vit_macs(f.img_size, f.patch_size, f.depth, f.width, f.mlp_hidden / f.width, 1000)

    f = min(figs, key=lambda f: abs(math.log(fig_flops(f) / want)))
    tflops = f.images_per_s * fig_flops(f) / 1e12
    return Compute(tflops, f"public: {f.model} on {f.gpu}, {f.images_per_s:.0f} images/s per GPU at batch "
                           f"{f.per_gpu_batch} ({f.source})")


# --------------------------------------------------------------------------- links

def link_from_doctor(path: str, bucket_bytes: float) -> Link:
    """Bus bandwidth from `hpctrain doctor --allreduce --json` at the size nearest a DDP bucket."""
    try:
        data: Any = json.loads(Path(path).read_text())
    except OSError as e:
        raise PlanError(f"cannot read {path}: {e.strerror}; give the file `hpctrain doctor --allreduce "
                        "--json` wrote") from None
    except json.JSONDecodeError:
        raise PlanError(f"{path} is not JSON: give the output of `hpctrain doctor --allreduce --json`") from None
    rows = data.get("allreduce") if isinstance(data, dict) else data
    return link_from_rows(rows, bucket_bytes, path)


def link_from_rows(rows, bucket_bytes: float, where: str) -> Link:
    """The measured row (allreduce.measure) whose message size is nearest one DDP bucket."""
    rows = [r for r in rows or [] if isinstance(r, dict) and r.get("busbw_GBps")]
    if not rows:
        raise PlanError(f"{where} has no all-reduce rows: run `hpctrain doctor --allreduce --json` over the "
                        "job's ranks (srun) and pass that file")
    r = min(rows, key=lambda r: abs(math.log(r["bytes"] / bucket_bytes)))
    return Link(r["busbw_GBps"], f"measured: {where} ({r['ranks']} ranks, {r['bytes'] / 2**20:.1f} MiB "
                                 f"messages, {r['busbw_GBps']:.3g} GB/s)")


def default_links(gpu: str, fabric: str) -> tuple[Link, Link]:
    intra = next((v for k, v in tables.NVLINK.items() if k.lower() in gpu.lower()), None)
    nvlink = intra is not None
    if intra is None:  # unknown GPU: assume the node's GPUs talk no faster than its network
        intra = tables.FABRICS[fabric]
    inter = tables.FABRICS[fabric]
    return (Link(intra.busbw_gbps, f"public: {intra.what} ({intra.source})", nccl=True, nvlink=nvlink),
            Link(inter.busbw_gbps, f"public: {inter.what} ({inter.source})", nccl=True, nvlink=nvlink))


# --------------------------------------------------------------------------- the plan

def build(cfg: Config, inputs: PlanInputs) -> Plan:
    return make_plan(workload(cfg, inputs.images_per_epoch), inputs.nodes, inputs.gpus_per_node,
                     inputs.compute, inputs.intra, inputs.inter, node_counts(inputs.nodes), inputs.overlap)


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
        f"{math.ceil(w.grad_bytes / w.bucket_bytes)} bucket(s) of {cfg.train.ddp_bucket_mb} MB; "
        f"within a node: {inputs.intra.source}; between nodes (fabric {inputs.fabric}): {inputs.inter.source}",
        ("overlap: DDP reduces each bucket during the backward that remains (backward = 2/3 of compute); "
         "exposed = max(one bucket, all-reduce - backward x (k-1)/k)" if inputs.overlap else
         "overlap: none (--no-overlap): the whole all-reduce follows the backward")
        + "; contention between NCCL and compute kernels, stragglers and network congestion are not modelled",
        f"data wait: {inputs.compute.data_wait_per_image_s * 1e3:.3f} ms per image"
        + (" (none given: assumed 0)" if not inputs.compute.data_wait_per_image_s else ""),
        f"epoch: {w.images_per_epoch:,} images ({inputs.images_source}), {w.steps_per_epoch:,} steps of "
        f"{w.global_batch}; {w.total_steps:,} steps in all; evaluation, checkpoints and start-up not counted",
        "efficiency: images/s at N nodes over N x images/s of the same recipe on 1 node",
    ] + (["train.parallel=fsdp: modelled as DDP; FSDP also all-gathers the weights (about 1.5x the "
          "bytes of a DDP all-reduce), so communication is under-estimated"] if cfg.train.parallel == "fsdp" else [])


def to_dict(cfg: Config, inputs: PlanInputs, plan: Plan) -> dict:
    def row(r) -> dict:
        st = r.step
        return {"nodes": st.nodes, "gpus": st.gpus, "per_gpu_batch": st.per_gpu_batch,
                "images_per_s": st.images_per_s, "step_s": st.step_s, "compute_s": st.compute_s,
                "allreduce_s": st.comm_s, "exposed_comm_s": st.exposed_s, "data_wait_s": st.data_wait_s,
                "epoch_s": r.epoch_s, "total_s": r.total_s, "gpu_hours": r.gpu_hours,
                "efficiency": r.efficiency}

    return {"nodes": inputs.nodes, "gpus_per_node": inputs.gpus_per_node,
            "global_batch": plan.work.global_batch, "grad_bytes": plan.work.grad_bytes,
            "train_flops_per_image": plan.work.train_flops_per_image,
            "images_per_epoch": plan.work.images_per_epoch, "total_steps": plan.work.total_steps,
            "target": row(plan.target) if plan.target else None, "rows": [row(r) for r in plan.rows],
            "skipped_node_counts": plan.skipped, "inputs": {**asdict(inputs)},
            "assumptions": assumptions(cfg, inputs, plan)}


def describe(cfg: Config, inputs: PlanInputs, plan: Plan) -> str:
    """The full printout: the target, the node-count table, the assumptions."""
    lines = [f"hpctrain plan: {cfg.model.arch} {cfg.model.img_size}²/{cfg.model.patch_size}, global batch "
             f"{cfg.data.batch_size}, {inputs.nodes} node(s) x {inputs.gpus_per_node} GPUs"]
    if plan.target is None:
        lines.append(f"  {inputs.nodes} node(s): data.batch_size={cfg.data.batch_size} does not split over "
                     f"{inputs.nodes * inputs.gpus_per_node} GPUs x train.accum_steps {cfg.train.accum_steps}")
    else:
        lines += ["  " + ln for ln in summary_lines(plan)]
    head = (f"  {'nodes':>5} {'GPUs':>5} {'per GPU':>7} {'images/s':>10} {'step ms':>8} {'compute':>8} "
            f"{'comm':>7} {'exposed':>8} {'data':>6} {'epoch':>9} {'total':>9} {'GPU-h':>8} {'eff.':>6}")
    lines += ["", head]
    for r in plan.rows:
        st = r.step
        eff = f"{100 * r.efficiency:.1f}%" if r.efficiency is not None else "-"
        mark = " <" if st.nodes == inputs.nodes else ""
        lines.append(f"  {st.nodes:>5} {st.gpus:>5} {st.per_gpu_batch:>7} {st.images_per_s:>10.0f} "
                     f"{1e3 * st.step_s:>8.1f} {1e3 * st.compute_s:>8.1f} {1e3 * st.comm_s:>7.2f} "
                     f"{1e3 * st.exposed_s:>8.2f} {1e3 * st.data_wait_s:>6.1f} {_dur(r.epoch_s):>9} "
                     f"{_dur(r.total_s):>9} {r.gpu_hours:>8.0f} {eff:>6}{mark}")
    if plan.skipped:
        lines.append(f"  (not shown: {', '.join(map(str, plan.skipped))} node(s), where the global batch does "
                     "not split evenly)")
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
        f"epoch {_dur(r.epoch_s)}, {plan.work.total_steps:,} steps {_dur(r.total_s)}, "
        f"{r.gpu_hours:,.0f} GPU-hours",
    ]


def summary(cfg: Config, profile, nodes: int, gpus_per_node: int, gpu: str = "H100") -> list[str]:
    """`submit --dry-run`'s plan lines from the shipped figures (no measured inputs)."""
    inputs = resolve(cfg, profile, nodes, gpus_per_node, gpu=gpu)
    plan = build(cfg, inputs)
    if plan.target is None:
        return []
    return ([f"plan ({gpu}, fabric {inputs.fabric}; public figures, `hpctrain plan` for the assumptions):"]
            + ["  " + ln for ln in summary_lines(plan)])


def resolve(cfg: Config, profile, nodes: int, gpus_per_node: int, gpu: str = "H100",
            bench_results: str | None = None, allreduce_results: str | None = None,
            tflops: float | None = None, busbw: float | None = None, data_wait_ms: float | None = None,
            images: int | None = None, overlap: bool = True) -> PlanInputs:
    """Every input of the model, from measurements where given, else the shipped figures."""
    if nodes < 1 or gpus_per_node < 1:
        raise PlanError(f"--nodes {nodes} --gpus-per-node {gpus_per_node}: both must be at least 1")
    if tflops is not None:
        if tflops <= 0:
            raise PlanError("--tflops must be a positive number of TFLOP/s per GPU, e.g. --tflops 150")
        compute = Compute(tflops, "--tflops")
    elif bench_results:
        compute = compute_from_bench(bench_results, cfg)
    else:
        compute = compute_from_table(gpu, cfg)
    if data_wait_ms is not None:
        if data_wait_ms < 0:
            raise PlanError("--data-wait-ms must be >= 0")
        per_gpu = cfg.data.batch_size // (nodes * gpus_per_node)
        compute = Compute(compute.tflops, compute.source, data_wait_ms / 1e3 / max(1, per_gpu))
    fabric = profile.fabric.kind
    intra, inter = default_links(gpu, fabric)
    if allreduce_results:
        message = min(grad_bytes(cfg), cfg.train.ddp_bucket_mb * 2**20)  # what one DDP bucket sends
        intra = inter = link_from_doctor(allreduce_results, message)
    if busbw is not None:
        if busbw <= 0:
            raise PlanError("--busbw must be a positive bus bandwidth in GB/s, e.g. --busbw 400")
        intra = inter = Link(busbw, "--busbw")
    n, src = images_per_epoch(cfg, images)
    return PlanInputs(nodes, gpus_per_node, compute, intra, inter, n, src, fabric, overlap)

"""What the training itself takes at a node count: the inputs of the step-time model (measured by
`hpctrain bench` / `hpctrain doctor --allreduce`, given on the command line, else the public figures of
`plan.tables`) resolved into a `plan.model.Plan`. Torch-free: runs on login nodes."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain import flops
from hpctrain.config import Config
from hpctrain.data.prep.imagenet import IMAGENET
from hpctrain.data.wds import META
from hpctrain.errors import UserError
from hpctrain.plan import tables
from hpctrain.plan.model import Compute, Link, Plan, Workload, make_plan, node_counts


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
    counts: tuple[int, ...] = ()  # the node counts to compare (--nodes 4,8,16); empty: around `nodes`


# --------------------------------------------------------------------------- the workload


def grad_bytes(cfg: Config) -> float:
    """Bytes DDP all-reduces per step: every trainable parameter's gradient, in fp32 (or bf16 when
    `dist.grad_reduce_dtype` says so, where that key exists)."""
    width = 2 if getattr(cfg.train, "grad_reduce_dtype", "fp32") == "bf16" else 4
    return float(flops.model_params(cfg.model) * width)


def workload(cfg: Config, images_per_epoch: int) -> Workload:
    return Workload(
        train_flops_per_image=flops.model_flops(cfg.model).train_flops,
        grad_bytes=grad_bytes(cfg),
        bucket_bytes=cfg.dist.ddp_bucket_mb * 2**20,
        global_batch=cfg.data.global_batch,
        accum_steps=cfg.train.accum_steps,
        images_per_epoch=images_per_epoch,
        epochs=cfg.train.epochs,
        max_steps=cfg.train.max_steps,
    )


def images_per_epoch(cfg: Config, given: int | None = None) -> tuple[int, str]:
    """(training images per epoch, where the count comes from)."""
    if given:
        return given, "--images-per-epoch"
    if cfg.data.loader == "synthetic":
        return cfg.data.synthetic_size, "data.synthetic_size"
    packed = Path(cfg.data.root) if cfg.data.root and cfg.data.format == "wds" else None
    if packed and (packed / META).is_file():  # the pack's own count (bad images left out), before any default
        return packed_train_size(packed)
    if cfg.model.num_classes == IMAGENET["classes"]:
        return IMAGENET["train"], "ImageNet-1k train split"
    train = Path(cfg.data.root) / "train" if cfg.data.root else None
    if train and train.is_dir() and cfg.data.format == "folder":
        return sum(1 for p in train.rglob("*") if p.is_file()), f"files under {train}"
    if packed:
        return packed_train_size(packed)  # no meta.json: says so
    raise PlanError(
        f"cannot tell how many images an epoch has ({cfg.model.num_classes} classes, data.root "
        f"{cfg.data.root or 'unset'}): give it to `hpctrain plan --images-per-epoch N`"
    )  # a flag of `plan` only: `submit --dry-run` prints this too, and refuses the flag


def packed_train_size(root: Path) -> tuple[int, str]:
    """(train images, source) from the shard index `hpctrain data pack` writes last (data/wds.py:
    meta.json's {"train": {"size": N, …}}): the login node has no DALI to open the shards with."""
    meta = root / META
    try:
        data = json.loads(meta.read_text())
        size = data["train"]["size"]
    except OSError:
        raise PlanError(
            f"data.root={root} has no {META} (data.format=wds reads the output of `hpctrain data pack`): "
            "pack the dataset first, or give `hpctrain plan --images-per-epoch N`"
        ) from None
    except (ValueError, TypeError, KeyError):
        size = None
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise PlanError(
            f"{meta} names no train split size (train.size): re-run `hpctrain data pack`, or give "
            "`hpctrain plan --images-per-epoch N`"
        )
    return size, f"train split of {meta}"


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
    recs = [
        r
        for r in _records(path)
        if r.get("images_per_s_per_device")
        and r.get("train_gflops_per_image")
        and not str(r.get("case", "")).startswith("timm")
    ]  # gpu_accept.json's "results" hold timm's too
    if not recs:
        raise PlanError(
            f"{path} holds no `hpctrain bench --json` record (images_per_s_per_device, "
            "train_gflops_per_image): run `hpctrain bench --config C --json > FILE` on the target GPU"
        )
    want = flops.model_flops(cfg.model).train_flops / 1e9

    # one rank (no communication in the figure), the closest model, the config's compile setting, the fastest
    def rank(r: dict) -> tuple:
        return (
            r.get("world_size", 1) != 1,
            round(abs(math.log(r["train_gflops_per_image"] / want)), 3),
            r.get("compile", cfg.compile.enabled) != cfg.compile.enabled,
            -r["images_per_s_per_device"],
        )

    r = min(recs, key=rank)
    tflops = r["images_per_s_per_device"] * r["train_gflops_per_image"] / 1e3
    step_s = r.get("step_time_ms", 0) / 1e3
    per_image_wait = r.get("data_wait", 0.0) * step_s / max(1, r.get("per_device_batch", 1) * r.get("accum_steps", 1))
    src = (
        f"measured: {path} ({r.get('device_name', '?')}, {r.get('arch', '?')}, batch "
        f"{r.get('per_device_batch', '?')} per device, {r.get('world_size', 1)} rank(s))"
    )
    return Compute(tflops, src, per_image_wait)


def compute_from_table(gpu: str, cfg: Config) -> Compute:
    """The published figure for this GPU whose model is closest in FLOPs per image, as TFLOP/s."""
    figs = [f for f in tables.GPU_FIGURES if f.gpu.lower() in gpu.lower()]
    if not figs:
        known = ", ".join(sorted({f.gpu for f in tables.GPU_FIGURES}))
        raise PlanError(
            f"no public training figure for GPU {gpu!r} (known: {known}): run `hpctrain bench "
            "--json` on it and pass --bench-results FILE, or give --tflops X"
        )
    want = flops.model_flops(cfg.model).train_flops

    def fig_flops(f: tables.GpuFigure) -> float:
        return 6.0 * flops.vit_macs(f.img_size, f.patch_size, f.depth, f.width, f.mlp_hidden / f.width, 1000)

    f = min(figs, key=lambda f: abs(math.log(fig_flops(f) / want)))
    tflops = f.images_per_s * fig_flops(f) / 1e12
    return Compute(
        tflops,
        f"public: {f.model} on {f.gpu}, {f.images_per_s:.0f} images/s per GPU at batch {f.per_gpu_batch} ({f.source})",
    )


# --------------------------------------------------------------------------- links


def link_from_doctor(path: str, bucket_bytes: float) -> Link:
    """Bus bandwidth from `hpctrain doctor --allreduce --json` at the size nearest a DDP bucket."""
    try:
        data: Any = json.loads(Path(path).read_text())
    except OSError as e:
        raise PlanError(
            f"cannot read {path}: {e.strerror}; give the file `hpctrain doctor --allreduce --json` wrote"
        ) from None
    except json.JSONDecodeError:
        raise PlanError(f"{path} is not JSON: give the output of `hpctrain doctor --allreduce --json`") from None
    rows = data.get("allreduce") if isinstance(data, dict) else data
    return link_from_rows(rows, bucket_bytes, path)


def link_from_rows(rows, bucket_bytes: float, where: str) -> Link:
    """The measured row (allreduce.measure) whose message size is nearest one DDP bucket."""
    rows = [r for r in rows or [] if isinstance(r, dict) and r.get("busbw_GBps")]
    if not rows:
        raise PlanError(
            f"{where} has no all-reduce rows: run `hpctrain doctor --allreduce --json` over the "
            "job's ranks (srun) and pass that file"
        )
    r = min(rows, key=lambda r: abs(math.log(r["bytes"] / bucket_bytes)))
    return Link(
        r["busbw_GBps"],
        f"measured: {where} ({r['ranks']} ranks, {r['bytes'] / 2**20:.1f} MiB messages, {r['busbw_GBps']:.3g} GB/s)",
    )


def default_links(gpu: str, fabric: str) -> tuple[Link, Link]:
    intra = next((v for k, v in tables.NVLINK.items() if k.lower() in gpu.lower()), None)
    nvlink = intra is not None
    if intra is None:  # unknown GPU: assume the node's GPUs talk no faster than its network
        intra = tables.FABRICS[fabric]
    inter = tables.FABRICS[fabric]
    return (
        Link(intra.busbw_gbps, f"public: {intra.what} ({intra.source})", nccl=True, nvlink=nvlink),
        Link(inter.busbw_gbps, f"public: {inter.what} ({inter.source})", nccl=True, nvlink=nvlink),
    )


# --------------------------------------------------------------------------- the plan


def build(cfg: Config, inputs: PlanInputs) -> Plan:
    return make_plan(
        workload(cfg, inputs.images_per_epoch),
        inputs.nodes,
        inputs.gpus_per_node,
        inputs.compute,
        inputs.intra,
        inputs.inter,
        list(inputs.counts) or node_counts(inputs.nodes),
        inputs.overlap,
    )


def resolve(
    cfg: Config,
    profile,
    nodes: int,
    gpus_per_node: int,
    gpu: str = "H100",
    bench_results: str | None = None,
    allreduce_results: str | None = None,
    tflops: float | None = None,
    busbw: float | None = None,
    data_wait_ms: float | None = None,
    images: int | None = None,
    overlap: bool = True,
    counts=(),
) -> PlanInputs:
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
        per_gpu = cfg.data.global_batch // (nodes * gpus_per_node)
        compute = Compute(compute.tflops, compute.source, data_wait_ms / 1e3 / max(1, per_gpu))
    fabric = profile.fabric.kind
    intra, inter = default_links(gpu, fabric)
    if allreduce_results:
        message = min(grad_bytes(cfg), cfg.dist.ddp_bucket_mb * 2**20)  # what one DDP bucket sends
        intra = inter = link_from_doctor(allreduce_results, message)
    if busbw is not None:
        if busbw <= 0:
            raise PlanError("--busbw must be a positive bus bandwidth in GB/s, e.g. --busbw 400")
        intra = inter = Link(busbw, "--busbw")
    n, src = images_per_epoch(cfg, images)
    return PlanInputs(nodes, gpus_per_node, compute, intra, inter, n, src, fabric, overlap, tuple(counts))

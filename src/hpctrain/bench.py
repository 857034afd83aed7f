"""`hpctrain bench`: throughput, MFU, data-wait share and peak memory of the configured training step.

What is timed is the Trainer's own `train_step` (the one `hpctrain train` runs: same DDP/FSDP
wrapping, AMP, compile, optimizer, accumulation), on synthetic batches made on the device by
default, or on the configured loader with `--loader`. Warm-up steps (compilation, allocator
growth, cuDNN autotuning) are run first and not counted; the device is synchronised only at the
ends of the timed window, so asynchronous execution is measured as it trains.
"""

from __future__ import annotations

import dataclasses
import platform
import resource
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from hpctrain import __version__
from hpctrain import flops as flopsmod
from hpctrain.config import Config
from hpctrain.data.build import build_loaders, resolve_loader
from hpctrain.data.prep.prepare import ensure_dataset
from hpctrain.run.metrics import table
from hpctrain.train import dist as distmod

# Every field of `hpctrain bench --json`, with what it means.
FIELDS: dict[str, str] = {
    "config": "config file (or 'inline')",
    "arch": "model.arch",
    "depth": "transformer blocks",
    "width": "embedding dimension",
    "heads": "attention heads",
    "img_size": "input side",
    "patch_size": "patch side",
    "params_m": "parameters (millions)",
    "device": "torch device",
    "device_name": "accelerator (or CPU) name",
    "world_size": "ranks",
    "global_batch": "images per optimizer step (all ranks)",
    "per_device_batch": "micro-batch per rank",
    "accum_steps": "micro-batches per step",
    "amp": "train.amp",
    "compile": "compile.enabled",
    "compile_mode": "compile.mode",
    "parallel": "what the step ran: fsdp (FSDP2, on one rank too) or ddp",
    "loader": "synthetic or the configured loader",
    "fused_adamw": "fused AdamW kernel in use",
    "tf32": "TF32 allowed (CUDA)",
    "sdpa_backend": "attention kernel PyTorch dispatched to (profiled)",
    "host_syncs_per_step": "device→host synchronisations in one step (CUDA sync debug; None on CPU)",
    "warmup_steps": "untimed steps first",
    "steps": "timed steps",
    "elapsed_s": "timed wall time",
    "first_step_s": "wall time of the first warm-up step, synchronised (None without warm-up)",
    "compile_s": "compile.enabled: first_step_s less a timed step's mean, the cold compile's cost (else None)",
    "step_time_ms": "mean wall time per optimizer step",
    "images_per_s": "all ranks",
    "images_per_s_per_device": "per rank",
    "data_wait": "share of the timed window spent in next(loader)",
    "fwd_gmacs_per_image": "forward multiply-adds per image (10^9)",
    "train_gflops_per_image": "model FLOPs per trained image, 3 × forward (10^9)",
    "achieved_tflops_per_device": "model TFLOP/s per device",
    "peak_tflops": "dense-bf16 spec peak per device, the MFU denominator (None: unknown)",
    "peak_source": "where peak_tflops comes from",
    "mfu": "model FLOPs utilisation 0-1 against peak_tflops (None: no peak)",
    "achievable_tflops": "measured large-matmul bf16 rate of this GPU (None: not measured)",
    "mfu_of_achievable": "model FLOP/s over achievable_tflops, 0-1 (None: not measured)",
    "peak_mem_mb": "peak memory (CUDA: max allocated in the timed window; CPU: process max RSS)",
    "peak_mem_kind": "cuda_max_allocated or cpu_max_rss",
    "loss": "loss of the last timed step",
    "torch": "torch version",
    "hpctrain": "hpctrain version",
}


def sync(device) -> None:
    import torch  # torch: a top-level module imports light (login node)

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(
    step: Callable[[Any], Any], next_batch: Callable[[], Any], steps: int, warmup: int, device
) -> dict[str, Any]:
    """Run `warmup` untimed steps, then `steps` timed ones; wall time, data wait, last loss, memory.

    The first warm-up step is timed on its own (synchronised at both ends): under torch.compile it
    holds the compilation, whose cost a GPU session needs to know to plan its time."""
    import torch  # torch: a top-level module imports light (login node)

    first = None
    for i in range(warmup):
        if i == 0:
            sync(device)
            t = time.perf_counter()
            step(next_batch())
            sync(device)
            first = time.perf_counter() - t
        else:
            step(next_batch())
    syncs = None
    if device.type == "cuda":
        batch = next_batch()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                step(batch)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = sum("synchroniz" in str(w.message).lower() for w in caught)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    wait, loss = 0.0, None
    t0 = time.perf_counter()
    for _ in range(steps):
        a = time.perf_counter()
        batch = next_batch()
        wait += time.perf_counter() - a
        loss = step(batch)
    sync(device)
    elapsed = time.perf_counter() - t0
    if device.type == "cuda":
        mem, kind = torch.cuda.max_memory_allocated(device) / 2**20, "cuda_max_allocated"
    else:
        mem, kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cpu_max_rss"
    return {
        "elapsed_s": elapsed,
        "data_wait_s": wait,
        "host_syncs_per_step": syncs,
        "first_step_s": first,
        "loss": float(loss) if loss is not None else None,
        "peak_mem_mb": mem,
        "peak_mem_kind": kind,
    }


def compile_seconds(first_step_s: float | None, step_s: float, compiled: bool) -> float | None:
    """The cold compile's cost: the first step's time beyond a warm step's (None when not compiled
    or no warm-up step was timed)."""
    if not compiled or first_step_s is None:
        return None
    return max(0.0, first_step_s - step_s)


def cycle(loader, accum: int) -> Callable[[], list]:
    """`accum` micro-batches at a time from `loader`, across epochs."""
    state: dict[str, Any] = {"epoch": 0, "it": None}

    def fresh() -> Iterator:
        loader.set_epoch(state["epoch"], 0)
        state["epoch"] += 1
        return iter(loader)

    def next_batches() -> list:
        out = []
        while len(out) < accum:
            if state["it"] is None:
                state["it"] = fresh()
            try:
                out.append(next(state["it"]))
            except StopIteration:
                state["it"] = None
        return out

    return next_batches


def figures(images_per_s: float, world: int, train_flops: float, peak: float | None) -> dict[str, Any]:
    return {
        "images_per_s": images_per_s,
        "images_per_s_per_device": images_per_s / world,
        "achieved_tflops_per_device": images_per_s * train_flops / world / 1e12,
        "mfu": flopsmod.mfu(images_per_s, train_flops, peak, world),
    }


def device_peak(device, given: float | None) -> tuple[str, float | None, str]:
    """(device name, peak TFLOP/s, source)."""
    import torch  # torch: a top-level module imports light (login node)

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine() or "cpu"
    if given:
        return name, given, "--peak-tflops"
    if device.type != "cuda":
        return name, None, "no CPU peak table: pass --peak-tflops"
    peak, source = flopsmod.peak_tflops(name)
    return name, peak, source


def measure(
    cfg: Config,
    steps: int = 20,
    warmup: int = 3,
    use_loader: bool = False,
    peak_tflops: float | None = None,
    config_name: str = "inline",
) -> dict[str, Any]:
    """Benchmark the training step `cfg` describes on this rank; the result dict has FIELDS."""
    import torch  # torch: a top-level module imports light (login node)

    from hpctrain.models.vit import arch_dims, build_vit
    from hpctrain.train import collective
    from hpctrain.train.amp import autocast_ctx
    from hpctrain.train.fastpath import sdpa_backend_used
    from hpctrain.train.loop import build_trainer
    from hpctrain.train.seeding import seed_step, step_seed

    if not use_loader:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, loader="synthetic"))
    elif cfg.data.prepare != "none":
        ensure_dataset(cfg)
    info = distmod.detect()
    cfg.per_rank_batch(info.world_size)  # the batch check, before anything starts
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    want = cfg.train.device
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        device = torch.device("cuda", info.local_rank % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    collective.init(
        info,
        "nccl" if device.type == "cuda" else "gloo",
        cfg.dist.pg_timeout_s,
        group_of_one=cfg.dist.parallel == "fsdp",
    )  # a one-GPU FSDP benchmark measures FSDP
    try:
        torch.manual_seed(cfg.train.seed)
        train_loader, _ = build_loaders(cfg, info.rank, info.world_size, device)
        model = build_vit(cfg.model)
        params = sum(p.numel() for p in model.parameters())
        trainer = build_trainer(cfg, info, device, None, train_loader, None, model)
        next_batches = cycle(train_loader, cfg.train.accum_steps)
        probe = next_batches()[0][0]
        backend = sdpa_backend_used(trainer.model, probe, autocast_ctx(cfg.train.amp, device))

        def step(batches):
            seed_step(step_seed(cfg.train.seed, trainer.step, info.rank), device)
            loss = trainer.train_step(batches)
            trainer.step += 1
            return loss

        timing = time_steps(step, next_batches, steps, warmup, device)
    finally:
        collective.shutdown()
    depth, width, heads = arch_dims(cfg.model)
    fl = flopsmod.model_flops(cfg.model)
    name, peak, source = device_peak(device, peak_tflops)
    achievable = flopsmod.achievable_tflops(name) if device.type == "cuda" else None
    elapsed = timing["elapsed_s"]
    images_per_s = cfg.data.global_batch * steps / elapsed
    out = {
        "config": config_name,
        "arch": cfg.model.arch,
        "depth": depth,
        "width": width,
        "heads": heads,
        "img_size": cfg.model.img_size,
        "patch_size": cfg.model.patch_size,
        "params_m": params / 1e6,
        "device": str(device),
        "device_name": name,
        "world_size": info.world_size,
        "global_batch": cfg.data.global_batch,
        "per_device_batch": cfg.per_rank_batch(info.world_size),
        "accum_steps": cfg.train.accum_steps,
        "amp": cfg.train.amp,
        "compile": cfg.compile.enabled,
        "compile_mode": cfg.compile.mode,
        "parallel": "fsdp" if trainer.fsdp else "ddp",
        "loader": resolve_loader(cfg.data.loader),
        "fused_adamw": bool(trainer.optimizer.defaults.get("fused")),
        "tf32": bool(device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32),
        "sdpa_backend": backend,
        "host_syncs_per_step": timing["host_syncs_per_step"],
        "warmup_steps": warmup,
        "steps": steps,
        "elapsed_s": elapsed,
        "step_time_ms": 1000 * elapsed / steps,
        "first_step_s": timing["first_step_s"],
        "compile_s": compile_seconds(timing["first_step_s"], elapsed / steps, cfg.compile.enabled),
        **figures(images_per_s, info.world_size, fl.train_flops, peak),
        "data_wait": timing["data_wait_s"] / elapsed,
        "fwd_gmacs_per_image": fl.fwd_macs / 1e9,
        "train_gflops_per_image": fl.train_flops / 1e9,
        "peak_tflops": peak,
        "peak_source": source,
        "achievable_tflops": achievable,
        "mfu_of_achievable": flopsmod.mfu(images_per_s, fl.train_flops, achievable, info.world_size),
        "peak_mem_mb": timing["peak_mem_mb"],
        "peak_mem_kind": timing["peak_mem_kind"],
        "loss": timing["loss"],
        "torch": torch.__version__,
        "hpctrain": __version__,
    }
    assert set(out) == set(FIELDS), set(out) ^ set(FIELDS)
    return out


def report(r: dict[str, Any]) -> str:
    """The human-readable table of one result."""
    mfu = "- (no peak: --peak-tflops)"
    if r["mfu"] is not None:
        mfu = f"{100 * r['mfu']:.1f} % of {r['peak_tflops']:g} TFLOP/s ({r['peak_source']})"
    if r.get("mfu_of_achievable") is not None:
        mfu += f"; {100 * r['mfu_of_achievable']:.1f} % of {r['achievable_tflops']:g} achievable"
    rows = [
        (
            "model",
            f"{r['arch']} depth {r['depth']} width {r['width']} heads {r['heads']}, "
            f"{r['img_size']}² / patch {r['patch_size']}, {r['params_m']:.1f} M params",
        ),
        ("device", f"{r['device']} ({r['device_name']}) × {r['world_size']}"),
        (
            "step",
            f"batch {r['global_batch']} (per device {r['per_device_batch']} × accum "
            f"{r['accum_steps']}), amp {r['amp']}, compile {r['compile']}, {r['parallel']}, "
            f"loader {r['loader']}",
        ),
        (
            "fast path",
            f"fused AdamW {r['fused_adamw']}, TF32 {r['tf32']}, SDPA {r['sdpa_backend']}, "
            f"host syncs/step {r['host_syncs_per_step']}",
        ),
        ("throughput", f"{r['images_per_s']:.1f} images/s ({r['images_per_s_per_device']:.1f} per device)"),
        (
            "step time",
            f"{r['step_time_ms']:.2f} ms (mean of {r['steps']} after {r['warmup_steps']} warm-up)"
            + ("" if r["compile_s"] is None else f"; compile {r['compile_s']:.1f} s"),
        ),
        (
            "model FLOPs",
            f"{r['fwd_gmacs_per_image']:.3f} GMAC forward, {r['train_gflops_per_image']:.2f} "
            f"GFLOP per trained image; {r['achieved_tflops_per_device']:.3f} TFLOP/s per device",
        ),
        ("MFU", mfu),
        ("data wait", f"{100 * r['data_wait']:.1f} %"),
        ("peak memory", f"{r['peak_mem_mb']:.0f} MB ({r['peak_mem_kind']})"),
        ("last loss", f"{r['loss']:.4f}"),
    ]
    return table(rows, "hpctrain bench")

"""The job's batch and learning rate as the GPUs will see them, checked before submission.

A global batch split over many GPUs can leave each a few images: the step is then all-reduce, not
compute (ViT-B/16: 346 MB of fp32 gradients per step whatever the batch). Below MIN_PER_GPU images
per GPU `submit` warns with the ways out; a per-GPU batch whose memory estimate (hpctrain.memory)
exceeds the GPU's memory is refused. Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain import memory
from hpctrain.config import Config
from hpctrain.errors import LaunchError

MIN_PER_GPU = 32  # images per GPU below which a ViT-B step is dominated by its gradient all-reduce
DEFAULT_GPU_MEM_GB = 80.0  # H100 SXM/PCIe 80 GB (the smaller of the usual H100/H200: 80/141 GB)
LARGE_BATCH_RECIPE = "configs/vit_b16_imagenet_4k.yaml"


@dataclass(frozen=True)
class BatchReport:
    global_batch: int
    gpus: int
    nodes: int
    accum_steps: int
    per_gpu: int  # images per GPU per micro-step
    memory: memory.MemoryEstimate | None  # None: CPU tasks, nothing to check
    gpu_mem_bytes: int

    def lines(self) -> list[str]:
        micro = f" × {self.accum_steps} accumulation steps" if self.accum_steps > 1 else ""
        out = [
            f"batch: {self.global_batch} global = {self.per_gpu} per GPU × {self.gpus} GPUs "
            f"({self.nodes} node(s) × {self.gpus // max(1, self.nodes)}){micro}"
        ]
        m = self.memory
        if m is not None:
            out.append(
                f"memory per GPU (estimate): {memory.gb(m.total)} of {memory.gb(self.gpu_mem_bytes)} "
                f"(weights+grads+optimizer+EMA {memory.gb(m.static)}, activations "
                f"{self.per_gpu} × {m.activations_per_image / 1e6:.0f} MB, overhead {memory.gb(m.overhead)})"
            )
        return out

    def warning(self, cfg: Config) -> str | None:
        """One warning below MIN_PER_GPU images per GPU, with the choices (GPU jobs only)."""
        if self.memory is None or self.per_gpu >= MIN_PER_GPU:
            return None
        g, gpn, acc = self.global_batch, self.gpus // self.nodes, self.accum_steps
        if self.nodes > 1:
            n = max(1, g // (MIN_PER_GPU * gpn * acc))
            fewer = f"fewer nodes (--nodes {n}: {g // (n * gpn * acc)} per GPU)"
        else:
            k = max(1, g // (MIN_PER_GPU * acc))
            fewer = f"fewer GPUs (--gpus-per-node {k}: {g // (k * acc)} per GPU)"
        scale = (
            f"the lr follows by optim.lr_scaling={cfg.optim.lr_scaling}"
            if cfg.optim.lr_ref_batch
            else "set optim.lr_ref_batch too, so that the lr follows"
        )
        return (
            f"{self.per_gpu} images per GPU ({g} global / {self.gpus} GPUs"
            f"{f' / {acc} accumulation steps' if acc > 1 else ''}) is below {MIN_PER_GPU}: every step "
            f"all-reduces the whole gradient for little compute, so the GPUs mostly wait. Choose: {fewer}; "
            f"the large-batch recipe (--config {LARGE_BATCH_RECIPE}); or a larger global batch "
            f"(--set data.global_batch={MIN_PER_GPU * self.gpus * acc}; {scale})"
        )

    def check(self, cfg: Config) -> None:
        """Refuse a per-GPU batch whose estimate does not fit, with the fixes in one line."""
        m = self.memory
        if m is None or m.total <= self.gpu_mem_bytes:
            return
        fit = m.max_batch(self.gpu_mem_bytes)
        fixes = []
        acc = memory.fit_accum(cfg, self.gpus, self.gpu_mem_bytes)  # what the tasks would take (a divisor of G)
        if fit and acc > self.accum_steps:
            micro = -(-self.global_batch // (acc * self.gpus))
            fixes.append(f"--set train.accum_steps={acc} ({micro} per micro-step)")
            more = -(-self.gpus * acc // self.accum_steps)
            fixes.append(
                f"{more} GPUs instead of {self.gpus} ({-(-self.global_batch // (self.accum_steps * more))} per GPU)"
            )
        if not cfg.model.grad_ckpt:
            fixes.append("--set model.grad_ckpt=true")
        if not fit and cfg.dist.parallel != "fsdp":
            fixes.append("--set dist.parallel=fsdp (shards weights, gradients and optimizer states)")
        fixes.append("--gpu-mem-gb if the GPUs have more memory")
        raise LaunchError(
            f"{self.per_gpu} images per GPU need about {memory.gb(m.total)} per GPU (estimate: "
            f"{memory.gb(m.static)} weights+grads+optimizer, {memory.gb(m.activations)} activations, "
            f"{memory.gb(m.overhead)} overhead) but a GPU has {memory.gb(self.gpu_mem_bytes)} "
            f"({fit} images fit): use {', or '.join(fixes)}"
        )

    def range_note(self, cfg: Config) -> str | None:
        """A node range at its fewest nodes (this report's size): where its per-GPU batch would not fit,
        the accumulation the tasks take there (memory.fit_accum; docs/launch.md, "Node ranges")."""
        m = self.memory
        if m is None or m.total <= self.gpu_mem_bytes:
            return None
        acc = memory.fit_accum(cfg, self.gpus, self.gpu_mem_bytes)
        if acc == self.accum_steps:
            return (
                f"on {self.nodes} node(s), the range's fewest, {self.per_gpu} images per GPU would not fit "
                f"({memory.gb(m.total)} of {memory.gb(self.gpu_mem_bytes)}) at any accumulation: raise the range's "
                "MIN, or --set model.grad_ckpt=true"
            )
        micro = -(-self.global_batch // (acc * self.gpus))
        return (
            f"on {self.nodes} node(s), the range's fewest, {self.per_gpu} images per GPU would not fit "
            f"({memory.gb(m.total)} of {memory.gb(self.gpu_mem_bytes)}): the tasks take train.accum_steps={acc} "
            f"there ({micro} per micro-step), the global batch unchanged"
        )


def batch_report(
    cfg: Config, nodes: int, gpus_per_node: int, gpu_mem_gb: float | None = None, gpus: bool = True
) -> BatchReport:
    """The per-GPU batch of `cfg` on nodes × gpus_per_node tasks; `gpus=False` (CPU tasks) skips the
    memory estimate. The global batch must split (config.check_batch) first; the per-GPU batch is the
    largest share (they may be uneven)."""
    world = nodes * gpus_per_node
    per = cfg.per_rank_batch(world)
    mem_gb = DEFAULT_GPU_MEM_GB if gpu_mem_gb is None else gpu_mem_gb
    if mem_gb <= 0:
        raise LaunchError(f"--gpu-mem-gb={mem_gb:g}: give the memory of one GPU in GB, e.g. 80 (H100) or 141 (H200)")
    est = memory.estimate(cfg, per, world) if gpus else None
    return BatchReport(cfg.data.global_batch, world, nodes, cfg.train.accum_steps, per, est, int(mem_gb * memory.GB))

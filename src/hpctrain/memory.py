"""Per-GPU memory of training a ViT, estimated from its shape without torch (login nodes: `submit`
refuses a per-GPU batch that cannot fit; `plan` reuses it).

What is counted, in bytes, for one rank:
- weights: fp32 master weights, every parameter (the sin-cos position embedding too);
- grads: one fp32 gradient per trainable parameter (DDP's `gradient_as_bucket_view` makes the
  buckets those gradients; without it the buckets are a second copy, counted under grads);
- optimizer: what the optimizer's OptimSpec keeps per trainable parameter (AdamW and LAMB: two fp32 moments);
- ema: a fp32 copy of the weights when `train.ema` > 0;
- amp_weights: the bf16/fp16 copies of the matmul and convolution weights that autocast makes in
  the forward pass and autograd keeps for the backward pass;
- activations: what autograd saves for the backward pass, per image, times the per-GPU batch
  (per block and token: the two LayerNorm inputs of the fp32 residual stream with their mean and
  rstd, the inputs of the four matmuls, q/k/v, the attention output and its log-sum-exp, the GELU
  input; plus the patch-embedding input, the final norm, the head and the loss). Attention is
  counted as the flash/memory-efficient kernels keep it (no tokens² matrix; `train.sdpa_backend=math`
  adds one per head). `model.grad_ckpt` keeps each block's input and one block's full set;
- overhead: an allowance, not a measurement: 2 GB for the CUDA context, cuBLAS/cuDNN workspaces and
  NCCL buffers, plus 10 % of the activations for the allocator's fragmentation and the transient
  activation gradients of the backward pass.
Under `dist.parallel=fsdp` (world size > 1) weights, grads and optimizer states are divided by the
world size, and two blocks' unsharded fp32 weights (all of them with `fsdp_reshard: false`) are added.

Not counted: the data loader's buffers (DALI's are on the GPU, a few hundred MB), `torch.compile`'s
workspaces, and the evaluation pass (no gradients: smaller than training). tests/test_memory.py checks
the parameter count against the real model and the activation count against the tensors autograd
saves (counted with `torch.autograd.graph.saved_tensors_hooks` on CPU).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from hpctrain.models.arch import arch_dims
from hpctrain.optim_spec import spec

GB = 1e9
CONTEXT_BYTES = int(2 * GB)  # CUDA context, library workspaces, NCCL buffers: an allowance
FRAGMENTATION = 0.10  # of the activations: allocator slack and transient gradients


@dataclass(frozen=True)
class ParamCount:
    trainable: int
    frozen: int  # the fixed sin-cos position embedding
    matmul: int  # weights and biases of the patch convolution and the Linear layers (autocast copies them)
    largest_block: int  # parameters of one transformer block


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU; `total` is what must fit."""

    batch: int  # images per GPU per micro-step
    weights: int
    grads: int
    optimizer: int
    ema: int
    amp_weights: int
    fsdp_gathered: int
    activations_per_image: int
    overhead_fixed: int

    @property
    def activations(self) -> int:
        return self.batch * self.activations_per_image

    @property
    def overhead(self) -> int:
        return self.overhead_fixed + int(FRAGMENTATION * self.activations)

    @property
    def static(self) -> int:
        """What does not grow with the batch (overhead aside)."""
        return self.weights + self.grads + self.optimizer + self.ema + self.amp_weights + self.fsdp_gathered

    @property
    def total(self) -> int:
        return self.static + self.activations + self.overhead

    def parts(self) -> dict[str, int]:
        return {
            **{k: v for k, v in asdict(self).items() if k != "batch"},
            "activations": self.activations,
            "overhead": self.overhead,
            "total": self.total,
        }

    def max_batch(self, capacity: int) -> int:
        """The largest per-GPU batch that fits in `capacity` bytes (0: not even one image)."""
        room = capacity - self.static - self.overhead_fixed
        return max(0, int(room // (self.activations_per_image * (1 + FRAGMENTATION))))


def tokens(mc) -> int:
    grid = mc.img_size // mc.patch_size
    return grid * grid + (1 if mc.has_class_token else 0)


def param_count(mc) -> ParamCount:
    """Parameters of `models.vit.ViT` built from ModelConfig `mc`, counted from its shape."""
    depth, d, _ = arch_dims(mc)
    h = int(d * mc.mlp_ratio)
    n = tokens(mc)
    patch = 3 * mc.patch_size**2 * d + d
    qkv, proj, fc1, fc2 = 3 * d * d + 3 * d, d * d + d, d * h + h, h * d + d
    block = 4 * d + qkv + proj + fc1 + fc2  # two LayerNorms (weight + bias) and four Linear layers
    rep = mc.rep_size
    head = (rep or d) * mc.num_classes + mc.num_classes + (d * rep + rep if rep else 0)  # + pre_logits.fc
    pos = n * d
    trainable = patch + depth * block + 2 * d + head + (d if mc.has_class_token else 0)
    trainable += pos if mc.pos_embed == "learn" else 0
    matmul = patch + depth * (qkv + proj + fc1 + fc2) + head
    return ParamCount(trainable, 0 if mc.pos_embed == "learn" else pos, matmul, block)


def block_activation_bytes(mc, amp: str, sdpa_backend: str = "auto") -> int:
    """Bytes one transformer block saves for the backward pass, per image."""
    _, d, heads = arch_dims(mc)
    h = int(d * mc.mlp_ratio)
    n = tokens(mc)
    a = 2 if amp in ("bf16", "fp16") else 4  # matmul inputs/outputs under autocast
    ln = 4 * d + 8  # fp32 LayerNorm input (the residual stream), mean and rstd
    per_token = (
        2 * ln  # norm1, norm2
        + 3 * a * d  # inputs of qkv and fc1; the attention output, which is proj's input
        + 3 * a * d  # q, k, v (views of one qkv tensor)
        + 4 * heads  # log-sum-exp of the attention (fp32)
        + 2 * a * h
    )  # GELU input (fc1 output) and fc2 input
    if mc.drop_rate > 0:  # a mask per dropout (attention output, after the GELU, after fc2) in its input's
        per_token += a * (2 * d + h)  # dtype, as ATen's unfused CPU dropout keeps it (CUDA's fused: bool, less)
    block = n * per_token
    if sdpa_backend == "math":  # the attention probabilities and scores per head
        block += 2 * heads * n * n * a
    return block


def activation_bytes_per_image(mc, amp: str, sdpa_backend: str = "auto") -> int:
    """Bytes autograd saves for the backward pass of one image (see the module docstring). The flash
    kernels (CUDA, and PyTorch's CPU flash attention) return the attention output laid out as
    tokens × heads, so proj takes it as a view: one tensor, counted once."""
    depth, d, _ = arch_dims(mc)
    n = tokens(mc)
    a = 2 if amp in ("bf16", "fp16") else 4
    block = block_activation_bytes(mc, amp, sdpa_backend)
    embed = a * 3 * mc.img_size**2  # the patch convolution keeps its (cast) input
    embed += 4 * n * d if mc.drop_rate > 0 else 0  # the position-embedding dropout's mask (fp32 input)
    ln = 4 * d + 8
    final = ln * (1 if mc.has_fc_norm else n)  # final norm over all tokens, or fc_norm on the pooled features
    # head input: in fp32 the token pool's slice is a view that keeps the whole final-norm output alive
    head_in = 4 * d * n if (a == 4 and mc.pool == "token" and not mc.has_fc_norm) else a * d
    head = head_in + 2 * 4 * mc.num_classes  # and the logits and log-softmax of the loss
    # grad_ckpt: each block keeps its fp32 input; the backward pass recomputes one block at a time
    blocks = depth * 4 * d * n + block if mc.grad_ckpt else depth * block
    return int(embed + blocks + final + head)


def optimizer_bytes_per_param(optim) -> int:
    """Optimizer state per trainable parameter (an OptimConfig), as its OptimSpec counts it (optim_spec.py):
    Adam and LAMB keep two moments in fp32 (the first in bf16 with optim.mu_dtype=bf16), SGD one momentum
    buffer, none without momentum. An optimizer without a spec is refused, not estimated as another."""
    return spec(optim.name).state_bytes(optim)


def checkpoint_bytes(cfg) -> int:
    """Bytes of a full checkpoint of `cfg` (a Config): fp32 weights, the optimizer's state and the EMA copy
    (what a save writes and a stop must have time for: plan.ckpt_cost, plan.interruptions)."""
    pc = param_count(cfg.model)
    weights = 4 * (pc.trainable + pc.frozen)
    return weights + optimizer_bytes_per_param(cfg.optim) * pc.trainable + (weights if cfg.train.ema > 0 else 0)


def estimate(cfg, per_gpu_batch: int, world_size: int = 1) -> MemoryEstimate:
    """Training memory per GPU of `cfg` (a Config) at `per_gpu_batch` images per micro-step."""
    mc, t = cfg.model, cfg.train
    pc = param_count(mc)
    shard = world_size if cfg.dist.parallel == "fsdp" and world_size > 1 else 1
    weights = 4 * (pc.trainable + pc.frozen) // shard
    grads = 4 * pc.trainable // shard
    if shard == 1 and world_size > 1 and not cfg.dist.ddp_bucket_view:
        grads *= 2  # DDP's buckets are a copy of the gradients
    gathered = 0
    if shard > 1:
        gathered = 4 * (pc.trainable + pc.frozen) if not cfg.dist.fsdp_reshard else 2 * 4 * pc.largest_block
    return MemoryEstimate(
        batch=per_gpu_batch,
        weights=weights,
        grads=grads,
        optimizer=optimizer_bytes_per_param(cfg.optim) * pc.trainable // shard,
        ema=4 * (pc.trainable + pc.frozen) if t.ema > 0 else 0,
        amp_weights=(2 * pc.matmul // shard if t.amp in ("bf16", "fp16") else 0),
        fsdp_gathered=gathered,
        activations_per_image=activation_bytes_per_image(mc, t.amp, t.sdpa_backend),
        overhead_fixed=CONTEXT_BYTES,
    )


def gb(n: float) -> str:
    return f"{n / GB:.1f} GB"


def fit_accum(cfg, world_size: int, capacity: int) -> int:
    """Accumulation steps that keep the largest per-GPU micro-batch of `cfg` at `world_size` ranks within
    `capacity` bytes: the config's own, raised to the next divisor of the global batch until the
    estimate fits (a node range on fewer nodes than planned: the same global batch, smaller
    micro-batches; docs/launch.md). The config's own when nothing fits (the run fails as it would have)."""
    g, acc = cfg.data.global_batch, cfg.train.accum_steps
    for a in range(acc, g + 1):
        if g % a or g // a < world_size:
            continue
        if estimate(cfg, -(-g // (a * world_size)), world_size).total <= capacity:
            return a
    return acc

"""The loop our two Adam-family optimizers share (AdamWLowMu, Lamb): closure, sparse refusal, lazy
first- and second-moment state, step count, and the grouping of each parameter group's tensors by
(device, dtype) so that a subclass updates a whole bucket with `torch._foreach_*` ops: a dozen calls
per bucket instead of a dozen kernels per tensor launched from Python (a ViT-S/16 has 152 tensors).

The state layout is the per-tensor one of torch's optimizers (`step` a CPU float32 scalar,
`exp_avg`, `exp_avg_sq`), so checkpoints written before the foreach rewrite load unchanged."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from hpctrain.train import compat


@dataclass
class Bucket:
    """One group's tensors on one device with one dtype, in parameter order; `steps` holds each
    tensor's step count after this step's increment (Python floats, for the bias corrections)."""

    params: list[torch.Tensor] = field(default_factory=list)
    grads: list[torch.Tensor] = field(default_factory=list)
    exp_avgs: list[torch.Tensor] = field(default_factory=list)
    exp_avg_sqs: list[torch.Tensor] = field(default_factory=list)
    step_tensors: list[torch.Tensor] = field(default_factory=list)
    steps: list[float] = field(default_factory=list)

    def chunks(self, most: int) -> list[Bucket]:
        """Consecutive parts of at most `most` values each (a larger tensor alone)."""
        if most <= 0:
            return [self]
        out, start, size = [], 0, 0
        for i, p in enumerate(self.params):
            if size and size + p.numel() > most:
                out.append(self._part(start, i))
                start, size = i, 0
            size += p.numel()
        out.append(self._part(start, len(self.params)))
        return out

    def _part(self, a: int, b: int) -> Bucket:
        return Bucket(
            self.params[a:b],
            self.grads[a:b],
            self.exp_avgs[a:b],
            self.exp_avg_sqs[a:b],
            self.step_tensors[a:b],
            self.steps[a:b],
        )


def copy_(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """dst[i].copy_(src[i]) (with dtype conversion) in one foreach call; one call per tensor for tensor
    subclasses (FSDP2's DTensor: torch 2.13 has no sharding rule for `_foreach_copy_`)."""
    if all(type(t) is torch.Tensor for t in dst):
        torch._foreach_copy_(dst, src)
    else:
        for d, s in zip(dst, src):
            d.copy_(s)


def as_fp32(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """fp32 copies of tensors stored in another dtype; fp32 ones are returned as they are, so callers
    that update in place update the originals."""
    if all(t.dtype == torch.float32 for t in tensors):
        return tensors
    out = [torch.empty_like(t, dtype=torch.float32) for t in tensors]
    copy_(out, tensors)
    return out


def fusable(b: Bucket, devices: tuple[str, ...] = ("cpu",)) -> bool:
    """Whether torch's fused Adam kernel can take the bucket: plain contiguous fp32 tensors on one of
    `devices` (on the CPU it reads each tensor's CPU step count itself; on an accelerator it wants the
    counts on the device: `AdamFamily.steps_on_device`; FSDP2's DTensors go through the foreach ops)."""
    fp32 = (t for ts in (b.params, b.grads, b.exp_avg_sqs) for t in ts)
    return all(
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.device.type in devices
        and t.dtype == torch.float32
        and t.is_contiguous()
        for t in fp32
    ) and all(t.is_contiguous() for t in b.exp_avgs)


def fused_adam_(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    steps: list[torch.Tensor],
    group: dict,
    *,
    lr: float,
    weight_decay: float = 0.0,
    grad_scale: torch.Tensor | None = None,
    found_inf: torch.Tensor | None = None,
) -> None:
    """torch's fused (Adam)W kernel, one pass over each tensor: m = lerp(m, g, 1-β1), v = β2·v + (1-β2)·g²,
    w = w·(1 - lr·λ) - lr/(1-β1^t) · m / (sqrt(v)/sqrt(1-β2^t) + ε) with t the (already incremented) step.
    GradScaler's tensors (fp16): the kernel divides the gradients by `grad_scale` and, where `found_inf`
    is set, writes nothing, reading both on the device."""
    beta1, beta2 = group["betas"]
    torch._fused_adamw_(
        params,
        grads,
        exp_avgs,
        exp_avg_sqs,
        [],
        steps,
        lr=lr,
        beta1=beta1,
        beta2=beta2,
        weight_decay=weight_decay,
        eps=group["eps"],
        amsgrad=False,
        maximize=False,
        grad_scale=grad_scale,
        found_inf=found_inf,
    )


class Scratch:
    """One flat fp32 CPU buffer, reused step after step for a chunk's temporaries (fresh ones each step
    cost page faults: large allocations are mapped and unmapped every time)."""

    def __init__(self):
        self.buf = torch.empty(0)

    def views(self, like: list[torch.Tensor], zero: bool = False) -> list[torch.Tensor]:
        """Contiguous fp32 views shaped as `like`, side by side in the buffer (grown when too small; on
        `like`'s device)."""
        n = sum(t.numel() for t in like)
        if self.buf.numel() < n or self.buf.device != like[0].device:
            self.buf = torch.empty(n, device=like[0].device)
        if zero:
            self.buf[:n].zero_()
        out, off = [], 0
        for t in like:
            out.append(self.buf[off : off + t.numel()].view(t.shape))
            off += t.numel()
        return out


def bias_corrections(beta: float, steps: list[float]) -> list[float]:
    """1 - β^t per tensor (the steps of one bucket are almost always all equal: computed once each)."""
    each = {t: 1 - beta**t for t in set(steps)}
    return [each[t] for t in steps]


class AdamFamily(torch.optim.Optimizer):
    mu_dtype: torch.dtype | None = None  # the first moment's dtype (None: the parameter's)
    # On the CPU a foreach call is a loop over its tensors anyway: updating ~4 MB of values at a time
    # keeps each pass's operands in cache and reuses the temporaries' memory, where whole-model passes
    # stream from DRAM and page-fault fresh temporaries (bench/optim_step.py, AdamWLowMu side by side
    # with chunks off and on: 1.45× → 1.12-1.25× torch's AdamW on a shared 2-core machine).
    # Accelerators take the whole bucket in one call per op (0: no chunks).
    cpu_chunk: int = 1 << 20
    # On the CPU, fp32 buckets take torch's fused Adam kernel (one pass per tensor instead of a pass per
    # op: bench/optim_step.py); False: the foreach ops everywhere (as an accelerator runs them).
    cpu_fused: bool = True
    # train.amp=fp16: GradScaler hands step() its found_inf (and grad_scale while the gradients are still
    # scaled) as device tensors instead of reading found_inf on the host first (torch.amp.GradScaler.step:
    # `_step_supports_amp_scaling`); fused buckets skip on the device (`update_scaled`), no host sync.
    _step_supports_amp_scaling = True
    # what the fp16 path updates at a time on an accelerator (its fp32 temporaries: AdamWLowMu's moment,
    # LAMB's update): 64 MiB of values, not a whole model's
    device_chunk: int = 1 << 24

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.scratch = Scratch()

    def __init__(
        self, params: Iterable, lr: float, betas: tuple[float, float], eps: float, weight_decay: float, **extra
    ):
        if lr <= 0 or eps <= 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(
                f"{type(self).__name__}: lr {lr}, eps {eps} must be > 0, weight_decay "
                f"{weight_decay} >= 0, betas {betas} in [0, 1)"
            )
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, **extra})
        self.scratch = Scratch()

    def fused(self, b: Bucket) -> bool:
        """Whether this bucket takes the fused kernel (`fusable` and `cpu_fused`)."""
        return self.cpu_fused and compat.cpu_fused_adam() and fusable(b)

    def update(self, b: Bucket, group: dict) -> None:
        """Apply this step to every tensor of the bucket (moments and parameters in place)."""
        raise NotImplementedError

    def update_scaled(self, b: Bucket, group: dict, grad_scale: torch.Tensor | None, found_inf: torch.Tensor) -> None:
        """`update` under fp16's GradScaler through the fused kernel (`kernel_takes`), which unscales by
        `grad_scale` and skips where `found_inf` is set, on the device; the step counts are on the device
        and already incremented (`step` takes the increment back where skipped)."""
        raise NotImplementedError

    def kernel_takes(self, b: Bucket) -> bool:
        """Whether `update_scaled` can take the bucket: torch's fused kernel on CUDA, or on the CPU where
        this torch has it (2.4+)."""
        return fusable(b, ("cuda", "cpu") if compat.cpu_fused_adam() else ("cuda",))

    def steps_on_device(self, b: Bucket) -> None:
        """Move the bucket's step counts to its parameters' device (the fused kernel reads them there;
        a count loaded from a checkpoint is a CPU scalar)."""
        for i, p in enumerate(b.params):
            s = b.step_tensors[i]
            if s.device != p.device:
                b.step_tensors[i] = self.state[p]["step"] = s.to(p.device)

    def _buckets(self, group: dict) -> list[Bucket]:
        buckets: dict[tuple, Bucket] = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError(f"{type(self).__name__} does not take sparse gradients")
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32)  # on the CPU: no device sync
                state["exp_avg"] = torch.zeros_like(p, dtype=self.mu_dtype, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            b = buckets.setdefault((p.device, p.dtype), Bucket())
            b.params.append(p)
            b.grads.append(p.grad)
            b.exp_avgs.append(state["exp_avg"])
            b.exp_avg_sqs.append(state["exp_avg_sq"])
            b.step_tensors.append(state["step"])
        return list(buckets.values())

    @torch.no_grad()
    def step(self, closure: Callable | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        todo = [(group, b) for group in self.param_groups for b in self._buckets(group)]
        found_inf: torch.Tensor | None = getattr(self, "found_inf", None)  # set by GradScaler.step (fp16)
        grad_scale: torch.Tensor | None = getattr(self, "grad_scale", None)
        if found_inf is not None and not all(self.kernel_takes(b) for _, b in todo):
            # not all fused (FSDP2's DTensors, fp16 or bf16 parameters): GradScaler's own way, one host read
            if found_inf.item():
                return loss
            if grad_scale is not None:
                inv = grad_scale.double().reciprocal().float()
                for _, b in todo:
                    torch._foreach_mul_(b.grads, inv)
            found_inf = None
        for group, b in todo:
            cpu = b.params[0].device.type == "cpu"
            if found_inf is None:
                torch._foreach_add_(b.step_tensors, 1)
                b.steps = torch.stack(b.step_tensors).tolist()  # CPU scalars: no device sync
                for part in b.chunks(self.cpu_chunk if cpu else 0):
                    self.update(part, group)
                continue
            self.steps_on_device(b)
            torch._foreach_add_(b.step_tensors, 1)
            for part in b.chunks(self.cpu_chunk if cpu else self.device_chunk):
                self.update_scaled(part, group, grad_scale, found_inf)
            skipped = found_inf.to(b.params[0].device, non_blocking=True)
            torch._foreach_sub_(b.step_tensors, [skipped] * len(b.step_tensors))  # a skipped step counts none
        return loss

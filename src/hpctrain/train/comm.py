"""How DDP reduces gradients: the dtype on the wire, static_graph, and a count of the bytes.

The reduction itself is PyTorch's (`default_hooks.allreduce_hook` for fp32, which does what
DDP does without a hook: divide by the world size, sum; `bf16_compress_hook` for bf16: cast the
bucket to bf16, all-reduce, copy back into the fp32 bucket). `CountingHook` wraps either and adds
up the bytes of every bucket handed to the collective, in the dtype the wrapped hook sends, so a
run can show what bf16 saves (`grad_reduce_bytes` in metrics.jsonl). docs/communication.md has
the sources and the measured figures.
"""

from __future__ import annotations

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
HOOKS = {"fp32": default_hooks.allreduce_hook, "bf16": default_hooks.bf16_compress_hook}


class CountingHook:
    """A DDP comm hook: `inner` reduces, this counts `numel × itemsize` of each bucket it sends."""

    def __init__(self, grad_reduce_dtype: str, group=None) -> None:
        self.inner = HOOKS[grad_reduce_dtype]
        # DDP reads a hook's __name__; for "bf16_compress_hook" it demands CUDA + NCCL >= 2.10 even
        # on gloo, which reduces bf16 on CPU too. compat.check_train does the NCCL check instead.
        self.__name__ = self.__qualname__ = f"counting_{self.inner.__name__}"
        self.itemsize = torch.empty((), dtype=DTYPES[grad_reduce_dtype]).element_size()
        self.group = group
        self.bytes = 0  # since the last `take`

    def __call__(self, state, bucket):  # no annotations: DDP checks them against the real classes
        self.bytes += bucket.buffer().numel() * self.itemsize
        return self.inner(state, bucket)

    def take(self) -> int:
        """Bytes reduced since the last call (per rank), and start counting afresh."""
        n, self.bytes = self.bytes, 0
        return n


def static_graph(cfg) -> bool:
    """DDP's static_graph for this config: `auto` turns it on where it is known to work.

    It needs the same used parameters and the same graph every step (true of the ViT: no unused
    parameters, drop-path masks samples, never skips a block). Off under gradient accumulation
    (`no_sync` breaks it: pytorch/pytorch#143580) and torch.compile (DDPOptimizer does not
    support it: pytorch/pytorch#109261).
    """
    choice = cfg.dist.ddp_static_graph
    if choice != "auto":
        return choice == "always"
    return cfg.train.accum_steps == 1 and not cfg.compile.enabled


def wrap(model: torch.nn.Module, device: torch.device, cfg) -> tuple[torch.nn.Module, CountingHook]:
    """`model` in DDP with the configured buckets, static_graph and reduction dtype."""
    ids = [device.index] if device.type == "cuda" else None
    ddp = torch.nn.parallel.DistributedDataParallel(
        model,
        device_ids=ids,
        gradient_as_bucket_view=cfg.dist.ddp_bucket_view,
        bucket_cap_mb=cfg.dist.ddp_bucket_mb,
        static_graph=static_graph(cfg),
    )
    hook = CountingHook(cfg.dist.grad_reduce_dtype)
    ddp.register_comm_hook(None, hook)  # state None: the hooks reduce over the default group
    return ddp, hook

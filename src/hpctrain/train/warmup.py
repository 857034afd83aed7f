"""What runs once before a start's (or resume's) first step, and changes nothing a step sees.

Under DDP: the torch.compile warm-up (compile before the first collective, then wait for every rank
on the control group) and the bucket settling (DDP re-lays its gradient buckets once; every real
step must see that layout for a bit-exact resume). Under FSDP: the compile warm-up with the
collectives' timeout raised to compile.timeout_s while it runs (FSDP's forward all-gathers, so its
compile cannot come before a collective). On a GPU: which attention kernel runs.
Each leaves the RNG streams, gradients, weights and optimizer as they were (docs/communication.md,
docs/checkpoints.md).
"""

from __future__ import annotations

import datetime
import logging
import time
from dataclasses import dataclass

import torch
import torch.distributed as td

from hpctrain.config import Config
from hpctrain.train import comm, fastpath
from hpctrain.train.amp import autocast_ctx
from hpctrain.train.seeding import rng_state, set_rng_state

log = logging.getLogger("hpctrain")


@dataclass
class WarmupTarget:
    """What the warm-ups run on: the model, its DDP wrapper (None without DDP) and the forward that
    steps call (the compiled model inside DDP, when compiled)."""

    cfg: Config
    device: torch.device
    world_size: int
    model: torch.nn.Module
    fwd_model: torch.nn.Module
    ddp: torch.nn.parallel.DistributedDataParallel | None
    optimizer: torch.optim.Optimizer
    step_amp: str  # the autocast a step runs under (none for bf16 under FSDP: its policy casts)
    control_group: td.ProcessGroup | None = None
    reduce_hook: comm.CountingHook | None = None
    fsdp: bool = False  # dist.parallel=fsdp


def before_first_step(t: WarmupTarget) -> None:
    """DDP: the compile warm-up (compile.enabled and compile.warmup) and the bucket settling; on a
    GPU, say which attention kernel runs."""
    if t.ddp is not None:
        if t.cfg.compile.enabled and t.cfg.compile.warmup:
            warm_compile(t)
        settle_ddp_buckets(t)
    elif t.fsdp and t.world_size > 1 and t.cfg.compile.enabled and t.cfg.compile.warmup:
        warm_compile_fsdp(t)
    if t.device.type == "cuda":
        log_attention_kernel(t.model, t.cfg, t.device)


def throwaway_input(cfg: Config, world_size: int, device: torch.device) -> torch.Tensor:
    """Zeros shaped like one micro-batch of a rank: what the warm-up and bucket settling run on."""
    b = cfg.per_rank_batch(world_size)
    return torch.zeros(b, 3, cfg.model.img_size, cfg.model.img_size, device=device)


def warm_compile(t: WarmupTarget) -> None:
    """compile.enabled under DDP: compile before the first collective, then wait for every rank.

    Inductor compiles at the first call, and the backward at the first backward (AOTAutograd
    lowers it lazily): unwarmed, that is inside DDP's first backward, whose all-reduces hold the
    fast ranks until the slowest rank's compile ends, past dist.pg_timeout_s on many cold ranks.
    So one forward + backward runs here under `no_sync` (inside DDP's forward, so DDPOptimizer
    splits the graph as in a step; no all-reduce, no bucket rebuild), on the input
    `settle_ddp_buckets` uses, with every RNG stream, every gradient and the optimizer left as
    they were; then a `monitored_barrier` on the gloo control group waits up to
    compile.timeout_s, not the process-group timeout (docs/communication.md).
    """
    assert t.ddp is not None, "the compile warm-up is DDP's"
    if t.ddp.static_graph:  # no_sync breaks static_graph (pytorch/pytorch#143580): compile in a step
        log.warning("compile.warmup skipped: DDP static_graph is on (dist.ddp_static_graph=always)")
        return
    t0 = time.perf_counter()
    with t.ddp.no_sync():
        throwaway_backward(t)
    warm_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    timeout = t.cfg.compile.timeout_s
    if td.get_backend(t.control_group) != "gloo":  # no gloo control group (not from train.entry)
        log.warning("compile.warmup: no gloo control group to wait on; the first step waits instead")
        return
    try:
        td.monitored_barrier(t.control_group, timeout=datetime.timedelta(seconds=timeout))
    except RuntimeError as e:
        raise RuntimeError(
            f"a rank did not finish its first torch.compile within compile.timeout_s="
            f"{timeout} ({str(e).splitlines()[0]}): raise compile.timeout_s, or warm "
            "compile.cache with a short run"
        ) from e
    log.info(
        "torch.compile warm-up: %.1f s here, then %.1f s waiting for the other ranks",
        warm_s,
        time.perf_counter() - t1,
    )


def throwaway_backward(t: WarmupTarget) -> None:
    """One forward + backward of the compiled model on `throwaway_input` (a zero loss), with every RNG
    stream and every gradient put back as they were; the optimizer is not touched."""
    rng = rng_state(t.device)
    params = list(t.model.parameters())
    grads = [p.grad for p in params]
    for p in params:  # a backward accumulates into an existing gradient: start from none
        p.grad = None
    with autocast_ctx(t.step_amp, t.device):
        out = t.fwd_model(throwaway_input(t.cfg, t.world_size, t.device))
    (out.float().sum() * 0.0).backward()
    for p, g in zip(params, grads):
        p.grad = g
    set_rng_state(rng, t.device)


def warm_compile_fsdp(t: WarmupTarget) -> None:
    """compile.enabled under FSDP: the first compile inside a collective timeout that fits a compile.

    FSDP's forward all-gathers each block's parameters as it comes, so the compile cannot come before
    the first collective as under DDP: a fast rank waits in an all-gather (or the backward's
    reduce-scatter) while a slow one compiles, and past dist.pg_timeout_s the job failed. So the
    default group's timeout is compile.timeout_s for one throwaway forward + backward (c10d's
    `_set_pg_timeout`, torch 2.3+; FSDP needs 2.4), then every rank waits on the control group
    (`monitored_barrier`, compile.timeout_s) and the timeout goes back to dist.pg_timeout_s before the
    first step. Gradients, RNG streams and the optimizer are left as they were.
    """
    set_timeout = td.distributed_c10d._set_pg_timeout  # private, c10d's own setter (2.3+; absent in 2.2)
    compile_timeout = datetime.timedelta(seconds=t.cfg.compile.timeout_s)
    t0 = time.perf_counter()
    set_timeout(compile_timeout)
    try:
        throwaway_backward(t)
        warm_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        if td.get_backend(t.control_group) == "gloo":
            td.monitored_barrier(t.control_group, timeout=compile_timeout)
    finally:
        set_timeout(datetime.timedelta(seconds=t.cfg.dist.pg_timeout_s))
    log.info(
        "torch.compile warm-up (FSDP, collectives under compile.timeout_s=%d): %.1f s here, then %.1f s "
        "waiting for the other ranks",
        t.cfg.compile.timeout_s,
        warm_s,
        time.perf_counter() - t1,
    )


def settle_ddp_buckets(t: WarmupTarget) -> None:
    """Throwaway backwards before the first real step, at every start or resume, until DDP has
    rebuilt its gradient buckets.

    DDP starts with all parameters in one bucket and re-lays them out (in gradient-ready order,
    a small first bucket) once, after the first backward that records that order: the 1st
    without static_graph, the 2nd with it (its 1st only counts hooks and all-reduces at the
    end). With more than 2 ranks the layout decides the order of each sum (its last bits), so
    every real step, resumed or not, must see the rebuilt layout (docs/checkpoints.md). The
    gradients are discarded; nothing else (RNG, optimizer, step) changes.
    """
    assert t.ddp is not None, "bucket settling is DDP's"
    rng = torch.get_rng_state()
    x = throwaway_input(t.cfg, t.world_size, t.device)
    for _ in range(3):  # 1 or 2 are needed; a 3rd that still rebuilds nothing is reported below
        with autocast_ctx(t.cfg.train.amp, t.device):
            out = t.fwd_model(x)
        (out.float().sum() * 0.0).backward()
        t.optimizer.zero_grad(set_to_none=True)
        if t.ddp.reducer._rebuild_buckets():  # what DDP's next forward would do; True once
            break
    else:
        log.warning(
            "DDP did not rebuild its gradient buckets in 3 throwaway backwards: a resume "
            "with more than 2 ranks may not be bit-exact"
        )
    torch.set_rng_state(rng)
    if t.reduce_hook:
        t.reduce_hook.take()  # its buckets are not a step's


def log_attention_kernel(model: torch.nn.Module, cfg: Config, device: torch.device) -> None:
    """Say which SDPA kernel attention runs on: flash or cuDNN expected, math is the slow path."""
    size = cfg.model.img_size
    x = torch.zeros(2, 3, size, size, device=device)  # no RNG drawn: eval-mode forward
    kind = fastpath.sdpa_backend_used(model, x, autocast_ctx(cfg.train.amp, device))
    if "math" in kind:
        log.warning(
            "attention runs on the math SDPA kernel (slow): check train.sdpa_backend, train.amp and the head dimension"
        )
    else:
        log.info("attention kernel: %s", kind)

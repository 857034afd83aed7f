"""FSDP2 (`fully_shard`) for models whose weights + optimizer state do not fit one device.

Every transformer block is its own shard unit (gathered just before it runs, freed after), the
root holds the rest (patch embedding, tokens, head). Sharded checkpoints (train/ckpt/sharded.py, the
default for several ranks) hold each rank's shards, resharded by DCP on load. Single-file ones
stay in the DDP format: a full, unsharded model state_dict and an optimizer state_dict keyed by
parameter index, gathered collectively and written by rank 0. Either way a run may resume under
either kind of parallelism and with another world size.

With `train.amp=bf16` the mixed precision is FSDP's own, as torchtitan does it
(`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)` on every unit, and no autocast): the
sharded parameters, their gradients and the optimizer state stay fp32; each unit's weights are
cast to bf16 when gathered (half the all-gather bytes), forward and backward run in bf16, and
gradients are reduce-scattered in fp32 (`dist.grad_reduce_dtype=bf16`: in bf16).
"""

from __future__ import annotations

import torch
import torch.distributed as td

from hpctrain.train import compat

# torch.distributed.checkpoint (~1.3-2.4 s to import) and device_mesh (~0.6 s) are imported in the
# functions that use them: every task imports this module with the loop; only FSDP runs pay for them.


def mixed_precision(amp: str, grad_reduce_dtype: str = "fp32"):
    """FSDP's policy for `train.amp`: bf16 compute with fp32 (or bf16) reduction; None otherwise
    (fp16 keeps autocast and the loss scaler, none is fp32 throughout)."""
    if amp != "bf16":
        return None
    reduce = torch.bfloat16 if grad_reduce_dtype == "bf16" else torch.float32
    # resolved at use: the loop imports this module on torch 2.2 too, where FSDP2 does not exist
    return compat.fsdp_mixed_precision()(param_dtype=torch.bfloat16, reduce_dtype=reduce)


def shard(
    model: torch.nn.Module,
    device: torch.device,
    reshard_after_forward: bool = True,
    amp: str = "none",
    grad_reduce_dtype: str = "fp32",
) -> None:
    """Shard `model` in place over all ranks: one unit per block, then the root.

    Rank 0's weights are broadcast first (as DDP does when it wraps), so every shard comes from
    one initialisation even when the ranks built their models from different random states.
    """
    if td.get_world_size() > 1:  # a world of one (FSDP on one GPU) has no other copy to agree with
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                td.broadcast(t.data, src=0)
    fully_shard = compat.fully_shard()  # at use: the loop imports this module on torch 2.2 too (no FSDP2 there)
    from torch.distributed.device_mesh import init_device_mesh  # ~0.6 s to import: FSDP runs only

    mesh = init_device_mesh(device.type, (td.get_world_size(),))
    kw = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    policy = mixed_precision(amp, grad_reduce_dtype)
    if policy is not None:
        kw["mp_policy"] = policy
    for block in getattr(model, "blocks", []):
        fully_shard(block, **kw)
    fully_shard(model, **kw)


def _param_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Parameter names in the optimizer's index order (the order torch numbers them in)."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    return [name_of[id(p)] for g in optimizer.param_groups for p in g["params"]]


def _full_options(**kw):
    """StateDictOptions for a full (unsharded) state dict, with `kw` (cpu_offload, broadcast_from_rank0)."""
    # torch.distributed.checkpoint: ~1.3-2.4 s to import; FSDP runs only
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def model_state(model: torch.nn.Module) -> dict:
    """Full state_dict on CPU (a collective: every rank calls it; empty except on rank 0)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict  # DCP: as _full_options

    return get_model_state_dict(model, options=_full_options(cpu_offload=True))


def optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Full optimizer state in torch's index-keyed format (collective; empty except on rank 0)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict  # DCP: as _full_options

    osd = get_optimizer_state_dict(model, optimizer, options=_full_options(cpu_offload=True))
    if not osd:
        return {}
    index = {n: i for i, n in enumerate(_param_names(model, optimizer))}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in osd["param_groups"]]
    return {"state": {index[n]: v for n, v in osd["state"].items()}, "param_groups": groups}


def load(model: torch.nn.Module, optimizer: torch.optim.Optimizer, model_sd: dict, optim_sd: dict) -> None:
    """Load full state dicts into the sharded model and optimizer (rank 0's copy is broadcast; the
    option needs torch >= 2.4, as FSDP2 does)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict  # DCP

    options = _full_options(broadcast_from_rank0=True)
    set_model_state_dict(model, model_sd, options=options)
    names = _param_names(model, optimizer)
    osd = {
        "state": {names[int(i)]: v for i, v in optim_sd["state"].items()},
        "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in optim_sd["param_groups"]],
    }
    set_optimizer_state_dict(model, optimizer, osd, options=options)

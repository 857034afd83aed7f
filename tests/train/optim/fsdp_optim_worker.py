"""Test worker: one rank of two stepping AdamWLowMu (optim.mu_dtype=bf16) on FSDP2-sharded parameters
(DTensors) beside the per-tensor reference on the whole ones; rank 0 writes the largest difference
to OUT/result.json (tests/train/optim/test_optim_foreach.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from hpctrain.train import compat
from hpctrain.train.optim.adamw import AdamWLowMu
from tests.train.optim.test_optim_foreach import PerTensor


def main(out: str) -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 6))
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 6))
    ref.load_state_dict(model.state_dict())
    compat.fully_shard()(model)
    hp = {"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1}
    opt = AdamWLowMu(model.parameters(), **hp)
    baseline = PerTensor([{"params": list(ref.parameters()), **hp}], "adamw", torch.bfloat16)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))  # the same batch on both ranks
    for _ in range(3):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        ref(x).square().mean().backward()  # FSDP's average of the two ranks' equal gradients is this one
        baseline.step()
        ref.zero_grad()
    diff = max((p.full_tensor() - q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))
    kinds = sorted({type(p).__name__ for p in model.parameters()})
    moments = sorted({str(opt.state[p]["exp_avg"].dtype) for p in model.parameters()})
    if dist.get_rank() == 0:
        Path(out, "result.json").write_text(json.dumps({"diff": diff, "kinds": kinds, "moments": moments}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])

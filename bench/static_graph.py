#!/usr/bin/env python3
"""What DDP's static_graph buys on CPU/gloo: the same step with `static_graph=True` and `False`.

Run under torchrun (gloo, one thread a rank). Each rank wraps two copies of the same tiny ViT in
DDP, one with static_graph and one without (same bucket size, PyTorch's fp32 allreduce hook as
`comm.wrap` registers), and times them interleaved (A B, B A, …) so load from elsewhere hits both
alike. A step is forward, cross-entropy, backward (the all-reduce), AdamW step. Each side gets
warm-up steps first: static_graph's first iteration is a delayed all-reduce, both rebuild their
buckets early. Prints per-step medians and the median of the per-repetition ratios (static/plain).

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 bench/static_graph.py [--reps 20] [--steps 5]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "digits_vit.yaml"))
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--reps", type=int, default=20, help="timed repetitions per side (default 20)")
    ap.add_argument("--steps", type=int, default=5, help="steps per repetition (default 5)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch
    import torch.distributed as td
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from hpctrain.config import load
    from hpctrain.models.vit import build_vit

    torch.set_num_threads(1)
    td.init_process_group("gloo")
    world, rank = td.get_world_size(), td.get_rank()
    cfg = load(args.config, ["train.amp=none", *args.overrides])
    b = cfg.per_rank_batch(world)
    torch.manual_seed(rank)
    x = torch.randn(b, 3, cfg.model.img_size, cfg.model.img_size)
    y = torch.randint(0, cfg.model.num_classes, (b,))
    torch.manual_seed(0)
    model = build_vit(cfg.model)
    sides = {}
    for name, static in (("static", True), ("plain", False)):
        ddp = torch.nn.parallel.DistributedDataParallel(
            copy.deepcopy(model),
            static_graph=static,
            bucket_cap_mb=cfg.dist.ddp_bucket_mb,
            gradient_as_bucket_view=cfg.dist.ddp_bucket_view,
        )
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        sides[name] = (ddp, torch.optim.AdamW(ddp.parameters(), lr=1e-4))

    def run(name: str, steps: int) -> float:
        ddp, opt = sides[name]
        td.barrier()
        t0 = time.perf_counter()
        for _ in range(steps):
            F.cross_entropy(ddp(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return (time.perf_counter() - t0) / steps

    for name in sides:
        run(name, 3)  # static_graph's delayed first all-reduce, both sides' bucket rebuild, warm-up
    times: dict[str, list[float]] = {"static": [], "plain": []}
    for r in range(args.reps):
        order = ("static", "plain") if r % 2 == 0 else ("plain", "static")
        for name in order:
            times[name].append(run(name, args.steps))
    med = {k: 1000 * statistics.median(v) for k, v in times.items()}
    pair = statistics.median(s / p for s, p in zip(times["static"], times["plain"]))
    result = {
        "world": world,
        "per_rank_batch": b,
        "reps": args.reps,
        "steps_per_rep": args.steps,
        "static_ms": med["static"],
        "plain_ms": med["plain"],
        "ratio_paired_median": pair,
        "torch": torch.__version__,
    }
    if rank == 0:
        if args.json:
            print(json.dumps(result))
        else:
            print(
                f"DDP static_graph on CPU/gloo: {world} ranks, batch {b} a rank, {args.reps} interleaved "
                f"reps × {args.steps} steps"
            )
            print(f"  static_graph=True   {med['static']:8.2f} ms/step (median)")
            print(f"  static_graph=False  {med['plain']:8.2f} ms/step (median)")
            print(f"  paired median       {pair:8.3f}  (static / plain)")
    td.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())

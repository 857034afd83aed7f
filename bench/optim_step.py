#!/usr/bin/env python3
"""Host time of one optimizer step on ViT-S/16's parameters: hpctrain's AdamWLowMu (bf16 first
moment) and Lamb against torch's AdamW(foreach=True), side by side in one process.

The parameters are hpctrain's own ViT-S/16 (`model.arch=vit_small`, 224², 1000 classes: 152
tensors, 22 M values) in the decay / no-decay groups training uses, with fixed random gradients,
on the CPU. The sides run interleaved (A B C, C B A, …) so load from elsewhere hits all alike; each
figure is the median over repetitions of the mean step time, each ratio the median of the
per-repetition ratios to torch's AdamW (target ≤ 1.2, docs/performance.md). Also counted: the ATen calls one
step makes as an accelerator runs it (a `torch._foreach_*` call counts once: one launch per chunk of
tensors on a GPU; on the CPU hpctrain's optimizers take torch's fused Adam kernel for fp32 tensors, in
~4 MB parts, train/optim/moments.py).

    PYTHONPATH=src python bench/optim_step.py [--reps 15] [--steps 5] [--threads 1] [--device cpu] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15, help="timed repetitions per optimizer (default 15)")
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps per repetition (default 5)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument(
        "--device",
        default="cpu",
        help="cpu (default) or cuda: on a GPU the time is the host's "
        "to issue the step, synchronised once per repetition",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from hpctrain.config import ModelConfig
    from hpctrain.models.vit import build_vit
    from hpctrain.train.optim.adamw import AdamWLowMu
    from hpctrain.train.optim.build import param_groups
    from hpctrain.train.optim.lamb import Lamb

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = build_vit(ModelConfig(arch="vit_small")).to(device)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-2
    hp = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8}
    groups = param_groups(model, 0.05)
    opts = {
        "torch_adamw": torch.optim.AdamW(groups, **hp, foreach=True),
        "adamw_low_mu": AdamWLowMu(param_groups(model, 0.05), **hp, mu_dtype=torch.bfloat16),
        "lamb": Lamb(param_groups(model, 0.05), **hp, always_adapt=True),
    }

    class Count(TorchDispatchMode):
        """Counts the ATen calls an optimizer step makes: a foreach call is one, whatever the tensor count."""

        def __init__(self):
            super().__init__()
            self.calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls += 1
            return func(*args, **(kwargs or {}))

    def timed(opt: torch.optim.Optimizer) -> float:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / args.steps

    calls = {}
    for name, opt in opts.items():  # warm-up: state allocation, first touch
        timed(opt)
        chunk, fused = getattr(opt, "cpu_chunk", 0), getattr(opt, "cpu_fused", False)
        # counted as an accelerator runs it: the foreach ops, one call per op for the whole bucket
        opt.cpu_chunk, opt.cpu_fused = 0, False
        with Count() as count:
            opt.step()
        calls[name] = count.calls
        opt.cpu_chunk, opt.cpu_fused = chunk, fused
    times: dict[str, list[float]] = {name: [] for name in opts}
    for r in range(args.reps):
        order = list(opts.items())
        for name, opt in order if r % 2 == 0 else order[::-1]:
            times[name].append(timed(opt))
    result = {
        "model": "vit_small patch 16 img 224",
        "tensors": sum(1 for _ in model.parameters()),
        "values": sum(p.numel() for p in model.parameters()),
        "threads": args.threads,
        "device": str(device),
        "reps": args.reps,
        "steps_per_rep": args.steps,
        "torch": torch.__version__,
    }
    for name, ts in times.items():
        result[f"{name}_ms"] = 1000 * statistics.median(ts)
        result[f"{name}_aten_calls"] = calls[name]
    for name in ("adamw_low_mu", "lamb"):
        result[f"{name}_ratio"] = statistics.median(a / b for a, b in zip(times[name], times["torch_adamw"]))
        result[f"{name}_ratio_of_minima"] = min(times[name]) / min(times["torch_adamw"])
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"optimizer step, host time ({result['model']}: {result['tensors']} tensors, "
            f"{result['values'] / 1e6:.1f} M values on {device}; {args.threads} thread(s), "
            f"{args.reps} interleaved reps × {args.steps} steps)"
        )
        print(
            f"  torch AdamW(foreach=True)  {result['torch_adamw_ms']:8.2f} ms/step   "
            f"{calls['torch_adamw']:4d} ATen calls/step"
        )
        for name, label in (("adamw_low_mu", "AdamWLowMu (bf16 mu)"), ("lamb", "Lamb")):
            print(
                f"  {label:<26} {result[f'{name}_ms']:8.2f} ms/step   {calls[name]:4d} ATen calls/step   "
                f"ratio {result[f'{name}_ratio']:.3f} (of minima {result[f'{name}_ratio_of_minima']:.3f}; "
                "target ≤ 1.2)"
            )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())

#!/usr/bin/env python3
"""The cost of the per-step finite check (train/health/guard.py) on a digits step, CPU; target ≤ 1 %
(docs/checkpoints.md).

Two measures, both in this one process:
- paired: the Trainer's own `train_step` with the check and without it (`FiniteFlag.update`
  swapped for a no-op), interleaved (A B, B A, …) so drift in the machine's load hits both alike;
  the headline is the median of the per-repetition ratios. On a shared machine its noise (~1 %)
  is larger than the effect, so also:
- isolated: the check alone (`isfinite`, `logical_or` into the device flag, and with clipping on
  one add of the gradient norm) timed over many calls, as a fraction of the median step;
- isolated: the total gradient norm that every step computes for its `grad_norm` record when
  clipping is off (`compat.grad_total_norm`, clip_grad_norm_'s norm without the clip).

    PYTHONPATH=src python bench/finite_check.py [--reps 40] [--steps 5] [--threads 1] [--json]
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
    ap.add_argument("--config", default=str(ROOT / "configs" / "digits_vit.yaml"))
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--reps", type=int, default=40, help="timed repetitions per side (default 40)")
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps per repetition (default 5)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch

    from hpctrain.config import load
    from hpctrain.data.synthetic import SyntheticLoader
    from hpctrain.models.vit import build_vit
    from hpctrain.train import compat
    from hpctrain.train.dist import DistInfo
    from hpctrain.train.health.guard import FiniteFlag
    from hpctrain.train.loop import build_trainer

    torch.set_num_threads(args.threads)
    sets = [
        "data.loader=synthetic",
        "train.amp=none",
        "compile.enabled=false",
        "train.ema=0",
        "aug.mixup=0",
        "aug.cutmix=0",
        "train.threads=0",
        "log.trackers=[]",
        *args.overrides,
    ]
    cfg = load(args.config, sets)
    device = torch.device("cpu")
    b = cfg.data.global_batch
    loader = SyntheticLoader(
        train=True,
        batch_size=b,
        world=1,
        rank=0,
        size=b * 2,
        img_size=cfg.model.img_size,
        num_classes=cfg.model.num_classes,
        seed=0,
        device=device,
    )
    torch.manual_seed(0)
    trainer = build_trainer(cfg, DistInfo(), device, None, loader, None, build_vit(cfg.model))
    batches = [(loader.images, loader.labels)]
    checked = trainer.guard.finite.update

    def steps(check: bool) -> float:
        trainer.guard.finite.update = checked if check else (lambda value: None)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss = trainer.train_step(batches)
        float(loss)
        return (time.perf_counter() - t0) / args.steps

    steps(True), steps(False)  # warm-up: allocator, oneDNN primitives
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(args.reps):
        for check in (True, False) if r % 2 == 0 else (False, True):
            times[check].append(steps(check))
    step_s = statistics.median(times[False])
    paired = statistics.median(a / b for a, b in zip(times[True], times[False]))

    flag, loss, norm = FiniteFlag(device), torch.tensor(2.3), torch.tensor(1.7)
    n = 20_000
    t0 = time.perf_counter()
    for _ in range(n):
        flag.update(loss)
    loss_only = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        flag.update(loss + norm)
    with_norm = (time.perf_counter() - t0) / n
    trainer.model(loader.images).float().sum().backward()  # gradients of every parameter, as in a step
    params = list(trainer.model.parameters())
    m = 2_000
    t0 = time.perf_counter()
    for _ in range(m):
        compat.grad_total_norm(params)
    grad_norm = (time.perf_counter() - t0) / m
    result = {
        "step_ms": 1000 * step_s,
        "grad_norm_us": 1e6 * grad_norm,
        "grad_norm_pct": 100 * grad_norm / step_s,
        "paired_ratio": paired,
        "check_us": 1e6 * loss_only,
        "check_with_grad_norm_us": 1e6 * with_norm,
        "check_pct": 100 * loss_only / step_s,
        "check_with_grad_norm_pct": 100 * with_norm / step_s,
        "reps": args.reps,
        "steps_per_rep": args.steps,
        "threads": args.threads,
        "batch": b,
        "torch": torch.__version__,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"finite check on a digits step (batch {b}, {args.threads} thread(s), {args.reps} interleaved reps "
            f"× {args.steps} steps)"
        )
        print(f"  step without the check   {result['step_ms']:8.2f} ms (median)")
        print(f"  paired ratio with/without {paired:8.4f}  (median of per-repetition ratios; noise ~1 %)")
        print(f"  the check alone          {result['check_us']:8.2f} µs = {result['check_pct']:.3f} % of a step")
        print(
            f"  with the grad norm added {result['check_with_grad_norm_us']:8.2f} µs = "
            f"{result['check_with_grad_norm_pct']:.3f} % of a step (target ≤ 1 %)"
        )
        print(
            f"  the gradient norm (no clipping) {result['grad_norm_us']:8.2f} µs = {result['grad_norm_pct']:.3f} % "
            "of a step"
        )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())

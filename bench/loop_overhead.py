#!/usr/bin/env python3
"""hpctrain's training loop vs a bare PyTorch loop: same tiny ViT, same batch, same CPU thread.

Both sides run in this one process, interleaved (A B, B A, …) so drift in the machine's load hits
both alike; threads are pinned. hpctrain's side is `Trainer.run` itself — schedule, seeding,
soft-target loss, loss accumulation, stop-flag check, metrics and the end-of-run state — on
synthetic batches; the bare side is `model(x); cross_entropy; backward; AdamW.step; zero_grad`.
Many short repetitions, so a burst of load from elsewhere spoils few of them. Prints per-step
medians, their ratio, the ratio of the minima and the median of the per-repetition ratios (the
headline: the least sensitive to load on a shared machine); target ≤ 1.05 (docs/performance.md).

    PYTHONPATH=src python bench/loop_overhead.py [--reps 30] [--steps 5] [--threads 1] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--config",
        default=str(ROOT / "configs" / "digits_vit.yaml"),
        help="model and batch (default: the digits demo's tiny ViT, batch 64)",
    )
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--reps", type=int, default=30, help="timed repetitions per side (default 30)")
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps per repetition (default 5)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--cpu", type=int, default=None, help="pin the process to this CPU core")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    import torch
    import torch.nn.functional as F

    from hpctrain.config import load
    from hpctrain.data.synthetic import SyntheticLoader
    from hpctrain.models.vit import build_vit
    from hpctrain.train.dist import DistInfo
    from hpctrain.train.loop import build_trainer

    torch.set_num_threads(args.threads)
    sets = [
        "data.loader=synthetic",
        "train.amp=none",
        "compile.enabled=false",
        "train.ema=0",
        "aug.mixup=0",
        "aug.cutmix=0",
        f"log.every={args.steps}",
        "train.threads=0",
        *args.overrides,
    ]
    cfg = load(args.config, sets)
    device = torch.device("cpu")
    batch = cfg.data.global_batch
    loader = SyntheticLoader(
        train=True,
        batch_size=batch,
        world=1,
        rank=0,
        size=batch * args.steps * (args.reps + 2),
        img_size=cfg.model.img_size,
        num_classes=cfg.model.num_classes,
        seed=0,
        device=device,
    )
    torch.manual_seed(0)
    model = build_vit(cfg.model)
    bare_model = copy.deepcopy(model)
    trainer = build_trainer(cfg, DistInfo(), device, None, loader, None, model)
    opt = torch.optim.AdamW(
        bare_model.parameters(),
        lr=cfg.peak_lr,
        betas=tuple(cfg.optim.betas),
        eps=cfg.optim.eps,
        weight_decay=cfg.optim.weight_decay,
    )
    x, y = loader.images, loader.labels
    smoothing = cfg.aug.label_smoothing

    def bare(steps: int) -> float:
        bare_model.train()
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = F.cross_entropy(bare_model(x), y, label_smoothing=smoothing)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        float(loss.detach())
        return (time.perf_counter() - t0) / steps

    def hpctrain(steps: int) -> float:
        trainer.total_steps = trainer.step + steps
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            trainer.run()
        return (time.perf_counter() - t0) / steps

    bare(args.steps)  # warm-up: allocator, first-touch, oneDNN primitives
    hpctrain(args.steps)
    times: dict[str, list[float]] = {"bare": [], "hpctrain": []}
    for r in range(args.reps):
        order = (("bare", bare), ("hpctrain", hpctrain))
        for name, fn in order if r % 2 == 0 else order[::-1]:
            times[name].append(fn(args.steps))
    med = {k: statistics.median(v) for k, v in times.items()}
    pair = statistics.median(h / b for h, b in zip(times["hpctrain"], times["bare"]))
    best = min(times["hpctrain"]) / min(times["bare"])
    result = {
        "model": f"depth {cfg.model.depth} width {cfg.model.width} img {cfg.model.img_size} "
        f"patch {cfg.model.patch_size}",
        "batch": batch,
        "threads": args.threads,
        "reps": args.reps,
        "steps_per_rep": args.steps,
        "bare_ms": 1000 * med["bare"],
        "hpctrain_ms": 1000 * med["hpctrain"],
        "ratio": med["hpctrain"] / med["bare"],
        "ratio_paired_median": pair,
        "ratio_of_minima": best,
        "torch": torch.__version__,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"loop overhead ({result['model']}, batch {batch}, {args.threads} thread(s), "
            f"{args.reps} interleaved reps × {args.steps} steps)"
        )
        print(f"  bare PyTorch loop   {result['bare_ms']:8.2f} ms/step (median)")
        print(f"  hpctrain Trainer    {result['hpctrain_ms']:8.2f} ms/step (median)")
        print(f"  ratio of medians    {result['ratio']:8.3f}")
        print(f"  ratio of minima     {best:8.3f}")
        print(f"  paired median       {pair:8.3f}  (median of the per-repetition ratios; target ≤ 1.05)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())

#!/usr/bin/env python3
"""Host costs on the training step's path, before and after (docs/data.md), side by side in one
process: each pair runs interleaved (A B, B A, …), each figure is the median over repetitions, each
ratio the median of the per-repetition ratios after/before.

- ema: one EMA update of hpctrain's ViT-S/16 (152 tensors): two `state_dict()` calls per step (before)
  against the cached live tensor lists (train/optim/ema.py);
- erase: one batch's random-erasing boxes for the DALI loader: a seeded numpy generator and a Python
  loop per sample (before) against one vectorised draw for the batch (data/erasing.erase_boxes_batch);
  ema_lists: the host part alone (the lists the lerp takes);
- dali_epoch: what an epoch boundary costs the DALI loader, the next epoch's pipeline built and started
  (DaliLoader._open, epochs 1, 2, …; run in a thread during the last batch) on a small JPEG set, CPU,
  with DeiT's RandAugment and random erasing: the graph traced from Python for every epoch (before)
  against deserialised from the loader's one trace with the epoch's seed and file list (after; the one
  trace, at epoch 0, is `after_trace_ms`). Then each side's first batch, untimed;
- dali_stall: what the training loop waits for at an epoch boundary, its next() on the first batch of
  epochs 1 and 2, with a simulated 0.25 s step (batch 8 of the same JPEGs): before (traced per epoch,
  the next epoch's build started at the last batch) against after (deserialised, started as many batches
  early as its last build time needs, DaliLoader._lead); `mid_ms`: the median wait on other batches.

    PYTHONPATH=src python bench/host_costs.py [--reps 15] [--batch 128] [--json] [--no-dali]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def paired(before, after, reps: int, inner: int) -> dict:
    """Median ms of each side and the median ratio after/before, interleaved repetitions."""
    tb, ta = [], []
    for r in range(reps):
        for side, out in ((before, tb), (after, ta)) if r % 2 == 0 else ((after, ta), (before, tb)):
            t0 = time.perf_counter()
            for _ in range(inner):
                side()
            out.append((time.perf_counter() - t0) / inner * 1e3)
    return {
        "before_ms": statistics.median(tb),
        "after_ms": statistics.median(ta),
        "ratio": statistics.median(a / b for a, b in zip(ta, tb)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15, help="interleaved repetitions per pair (default 15)")
    ap.add_argument("--batch", type=int, default=128, help="per-GPU batch for the erase boxes (default 128)")
    ap.add_argument("--no-dali", action="store_true", help="skip the DALI pipeline build")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    import torch

    from hpctrain.config import ModelConfig
    from hpctrain.data import erasing, sampling
    from hpctrain.models.vit import build_vit
    from hpctrain.train.optim.ema import EMA

    torch.set_num_threads(1)
    result: dict = {"reps": args.reps, "torch": torch.__version__}

    model = build_vit(ModelConfig(arch="vit_small"))
    ema, old = EMA(model, 0.9999), copy.deepcopy(model).float()

    @torch.no_grad()
    def ema_before():  # train/optim/ema.py before the cache
        e = list(old.state_dict().values())
        s = list(model.state_dict().values())
        floats = [(a, b) for a, b in zip(e, s) if a.is_floating_point()]
        torch._foreach_lerp_([a for a, _ in floats], [b.float() for _, b in floats], 1e-4)

    result["ema"] = paired(ema_before, lambda: ema.update(model), args.reps, 5)

    def lists_before():  # the host part alone: what an accelerator waits for before the lerp is queued
        e = list(old.state_dict().values())
        s = list(model.state_dict().values())
        floats = [(a, b) for a, b in zip(e, s) if a.is_floating_point()]
        return [a for a, _ in floats], [b.float() for _, b in floats]

    def lists_after():
        ema_l, src, fp32 = ema._tensors(model)
        return ema_l, src if fp32 else [b.float() for b in src]

    result["ema_lists"] = paired(lists_before, lists_after, args.reps, 20)

    n, size, prob, count = args.batch, 224, 0.25, 1
    idx, it = np.random.default_rng(0).permutation(100_000), iter(range(10**9))

    def erase_before():  # data/dali.py's erase_source before: one generator per sample
        i = next(it) % 500
        for j in range(n):
            key = [*sampling.sample_seed(0, 3, int(idx[i * n + j]), 0), 0xE5A]
            erasing.erase_boxes(size, size, np.random.default_rng(key), prob, count)

    def erase_after():
        i = next(it) % 500
        keys = np.stack(
            [
                np.ones(n, np.int64),
                np.zeros(n, np.int64),
                np.full(n, 3),
                idx[i * n : (i + 1) * n],
                np.zeros(n, np.int64),
            ],
            axis=1,
        )
        erasing.erase_boxes_batch(size, size, keys, prob, count)

    result["erase"] = {**paired(erase_before, erase_after, args.reps, 3), "batch": n}

    if not args.no_dali:
        warnings.simplefilter("ignore", DeprecationWarning)  # RandAugment's graph, from DALI's own code
        sys.path.insert(0, str(ROOT / "bench"))
        from loader import make_jpegs

        from hpctrain.data.augment import AugmentSpec
        from hpctrain.data.dali import DaliLoader, _Epoch, build_pipeline, pipeline_seed
        from hpctrain.data.folder import list_split
        from hpctrain.data.randaug import parse_randaugment

        class TracedEachEpoch(DaliLoader):  # data/dali.py's DaliLoader._open before the graph was traced once a run
            def _open(self, epoch: int):
                reader, files, real = self._reader(epoch)
                pipe = build_pipeline(
                    True,
                    "folder",
                    reader,
                    self.aug,
                    batch_size=self.batch_size,
                    threads=self.threads,
                    device=self.device,
                    seed=pipeline_seed(self.seed, epoch, self.rank, 1),
                    erase_source=self.erase_source(epoch),
                )
                ep = _Epoch(epoch, pipe, files, real)
                ep.schedule(len(self))
                return ep

        with tempfile.TemporaryDirectory() as tmp:
            make_jpegs(Path(tmp), 256)
            aug = AugmentSpec(
                img_size=224,
                crop_pct=0.875,
                scale_min=0.08,
                hflip=0.5,
                mean=(0.5,) * 3,
                std=(0.5,) * 3,
                randaugment=parse_randaugment("rand-m9-mstd0.5-inc1"),
                reprob=0.25,
            )  # DeiT's recipe
            kw = dict(
                train=True,
                aug=aug,
                batch_size=32,
                rank=0,
                world=1,
                seed=0,
                threads=2,
                device=torch.device("cpu"),
                listing=list_split(Path(tmp), "train"),
            )
            before, after = TracedEachEpoch(**kw), DaliLoader(**kw)
            t0 = time.perf_counter()
            first = after._open(0)  # the loader's one trace
            trace_ms = (time.perf_counter() - t0) * 1e3
            first.pipe.outputs()
            del first
            tb, ta = [], []
            for r in range(max(3, args.reps // 3)):
                for side, out in ((before, tb), (after, ta)) if r % 2 == 0 else ((after, ta), (before, tb)):
                    t0 = time.perf_counter()
                    ep = side._open(r + 1)
                    out.append((time.perf_counter() - t0) * 1e3)
                    ep.pipe.outputs()
                    del ep
            result["dali_epoch"] = {
                "before_ms": statistics.median(tb),
                "after_ms": statistics.median(ta),
                "ratio": statistics.median(a / b for a, b in zip(ta, tb)),
                "after_trace_ms": trace_ms,
                "traces_after": after.traces,
                "per": "epoch",
                "epochs": len(ta),
                "images": 256,
                "batch": 32,
            }
            del before, after

            class LastBatchStart(TracedEachEpoch):  # and the next epoch's build started at the last batch
                def _lead(self, gap):
                    return 0

            stalls: dict = {"before": [], "after": [], "before_mid": [], "after_mid": []}
            for r in range(2):
                for side in ("before", "after") if r % 2 == 0 else ("after", "before"):
                    loader = (LastBatchStart if side == "before" else DaliLoader)(**{**kw, "batch_size": 8})
                    for e in range(3):
                        loader.set_epoch(e)
                        it, waits = iter(loader), []
                        while True:
                            t0 = time.perf_counter()
                            if next(it, None) is None:
                                break
                            waits.append((time.perf_counter() - t0) * 1e3)
                            time.sleep(0.25)  # the training step
                        if e:
                            stalls[side].append(waits[0])
                            stalls[f"{side}_mid"] += waits[2:-1]
                    del it, loader
            result["dali_stall"] = {
                "before_ms": statistics.median(stalls["before"]),
                "after_ms": statistics.median(stalls["after"]),
                "before_mid_ms": statistics.median(stalls["before_mid"]),
                "after_mid_ms": statistics.median(stalls["after_mid"]),
                "boundaries": len(stalls["after"]),
                "step_s": 0.25,
                "batch": 8,
            }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"host costs on the step path (median of {args.reps} interleaved reps; ratio after/before)")
        for k, label, per in (
            ("ema", "EMA update, ViT-S/16", "step"),
            ("ema_lists", "  its tensor lists", "step"),
            ("erase", f"erase boxes, batch {n}", "batch"),
        ):
            r = result[k]
            print(
                f"  {label:<26} before {r['before_ms']:8.3f} ms/{per}  after {r['after_ms']:8.3f} ms/{per}  "
                f"ratio {r['ratio']:.3f}"
            )
        if "dali_epoch" in result:
            r = result["dali_epoch"]
            print(
                f"  {'DALI epoch boundary':<26} before {r['before_ms']:8.1f} ms/epoch  after {r['after_ms']:8.1f} "
                f"ms/epoch  ratio {r['ratio']:.3f}  (after: one trace of {r['after_trace_ms']:.0f} ms per run)"
            )
            r = result["dali_stall"]
            print(
                f"  {'  its wait in the loop':<26} before {r['before_ms']:8.1f} ms/epoch  after {r['after_ms']:8.1f} "
                f"ms/epoch  (other batches: {r['before_mid_ms']:.1f} / {r['after_mid_ms']:.1f} ms)"
            )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())

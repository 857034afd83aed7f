#!/usr/bin/env python3
"""Cold vs warm compile cache: time from process start to the end of the first training step of the
digits model with `compile.enabled=true` on CPU (needs a C compiler), in pairs.

Each pair starts from an empty `compile.cache`: the first run compiles from scratch (cold),
the second finds what the first left (warm, as a requeued attempt does). The clock runs from
starting `python -m hpctrain train` until rank 0's metrics.jsonl holds the step-1 record (log.every=1:
written at the end of step 1), polled every 20 ms. Inductor's FX graph cache hits and misses are read
from the run's log.

    PYTHONPATH=src python bench/compile_cache.py [--pairs 2] [--threads 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
CONFIG = ROOT / "src" / "hpctrain" / "configs" / "digits_vit.yaml"


def first_step_s(digits: Path, runs: Path, name: str, cache: Path, threads: int) -> tuple[float, list[int]]:
    """Seconds from process start to the step-1 record; (hits, misses) of the FX graph cache."""
    sets = [
        f"data.root={digits}",
        f"run.dir={runs}",
        f"run.name={name}",
        f"train.threads={threads}",
        "log.every=1",
        "train.eval_every_epochs=0",
        "ckpt.every=0",
        "log.trackers=[]",
        "train.max_steps=1",
        "compile.enabled=true",
        f"compile.cache={cache}",
        "run.resume=none",
    ]
    args = [sys.executable, "-m", "hpctrain", "train", "--config", str(CONFIG)]
    for s in sets:
        args += ["--set", s]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": str(threads)}
    metrics = runs / name / "metrics.jsonl"
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    took = None
    while took is None:
        if metrics.exists() and '"kind": "train"' in metrics.read_text():
            took = time.perf_counter() - t0
        elif proc.poll() is not None:
            raise SystemExit(f"run {name} ended (exit {proc.returncode}) before its first step: see {runs / name}")
        else:
            time.sleep(0.02)
    if proc.wait() != 0:
        raise SystemExit(f"run {name} failed: see {runs / name}/logs")
    log = (runs / name / "logs" / "rank-0.log").read_text()
    m = re.search(r"FX graph cache (\d+) hits, (\d+) misses", log)
    return took, [int(m.group(1)), int(m.group(2))] if m else []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from hpctrain.data.prep.digits import write_digits

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_digits(tmp / "digits")
        for i in range(args.pairs):
            cache = tmp / f"cache-{i}"
            cold, cold_c = first_step_s(tmp / "digits", tmp / "runs", f"cold-{i}", cache, args.threads)
            warm, warm_c = first_step_s(tmp / "digits", tmp / "runs", f"warm-{i}", cache, args.threads)
            rows.append(
                {
                    "pair": i,
                    "cold_s": round(cold, 2),
                    "warm_s": round(warm, 2),
                    "cold_fxgraph": cold_c,
                    "warm_fxgraph": warm_c,
                }
            )
    out = {
        "what": "process start to end of step 1, digits ViT, compile.enabled=true, CPU",
        "threads": args.threads,
        "pairs": rows,
        "median_cold_s": statistics.median(r["cold_s"] for r in rows),
        "median_warm_s": statistics.median(r["warm_s"] for r in rows),
    }
    out["speedup"] = round(out["median_cold_s"] / max(out["median_warm_s"], 1e-9), 2)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for r in rows:
        print(
            f"pair {r['pair']}: cold {r['cold_s']:.1f} s (FX graph hits/misses {r['cold_fxgraph']}), "
            f"warm {r['warm_s']:.1f} s ({r['warm_fxgraph']})"
        )
    print(
        f"median: cold {out['median_cold_s']:.1f} s, warm {out['median_warm_s']:.1f} s: "
        f"{out['speedup']:.2f}x faster to the first step"
    )


if __name__ == "__main__":
    main()

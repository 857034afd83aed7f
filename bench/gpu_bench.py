#!/usr/bin/env python3
"""Driver of bench/gpu.sh: hpctrain ViT-B/16 (eager, compiled) and timm, side by side, one table.

Every case runs in its own process (clean peak-memory counters, a crash or OOM costs one row),
in priority order under a wall-clock budget; what does not fit is listed as skipped. Writes
results.csv, results.json, env.json and table.txt into --out and prints the table last.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["case", "impl", "mode", "batch", "status", "images_per_s", "step_time_ms", "mfu_pct",
           "mfu_achievable_pct", "peak_mem_gb", "ratio_to_timm", "sdpa_backend", "fused_adamw", "host_syncs_per_step",
           "loss", "wall_s"]
TINY = ["model.depth=2", "model.width=64", "model.heads=2", "model.img_size=32", "model.patch_size=8",
        "model.num_classes=10"]


def cases(batches: list[int], smoke: bool, have_timm: bool) -> list[dict]:
    """Priority order: the headline (compiled) pair at the first batch first."""
    out = []
    for b in batches:
        out += [{"impl": "hpctrain", "mode": "compiled", "batch": b},
                {"impl": "timm", "mode": "compiled", "batch": b},
                {"impl": "hpctrain", "mode": "eager", "batch": b}]
    for c in out:
        if smoke and c["impl"] == "timm":
            c["mode"] = "eager"  # the smoke run checks timm's path without a cold CPU compile
        c["case"] = f"{c['impl']}-{c['mode']}-b{c['batch']}"
        if smoke and c["mode"] == "compiled":
            c["skip"] = "cpu smoke: compile skipped"
        if c["impl"] == "timm" and not have_timm:
            c["skip"] = "timm not installed"
    return out


def command(c: dict, a: argparse.Namespace) -> list[str]:
    peak = ["--peak-tflops", str(a.peak_tflops)] if a.peak_tflops else []
    if c["impl"] == "timm":
        return [sys.executable, str(ROOT / "bench" / "timm_step.py"), "--batch", str(c["batch"]),
                "--steps", str(a.steps), "--warmup", str(a.warmup),
                "--compile" if c["mode"] == "compiled" else "--no-compile",
                *(["--tiny"] if a.cpu_smoke else []), *peak]
    sets = [f"data.batch_size={c['batch']}", f"train.compile={str(c['mode'] == 'compiled').lower()}",
            *(TINY if a.cpu_smoke else [])]
    cmd = [sys.executable, "-m", "hpctrain.cli.bench", "--config", str(ROOT / "configs" / "bench_vit_b16.yaml"),
           "--steps", str(a.steps), "--warmup", str(a.warmup), "--json", *peak]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def run_case(c: dict, a: argparse.Namespace, left: float, log) -> dict:
    row = {k: "" for k in COLUMNS} | {k: c[k] for k in ("case", "impl", "mode", "batch")}
    if "skip" in c:
        row["status"] = f"skipped ({c['skip']})"
        return row
    need = a.est_compiled_s if c["mode"] == "compiled" else a.est_eager_s
    if left < need:
        row["status"] = f"skipped (time budget: {left:.0f} s left, needs ~{need:.0f} s)"
        return row
    cmd = command(c, a)
    print(f"== {c['case']}: {' '.join(cmd[1:])}", file=log, flush=True)
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=max(10.0, left))
    except subprocess.TimeoutExpired:
        row["status"], row["wall_s"] = "timeout", f"{time.perf_counter() - t0:.0f}"
        return row
    row["wall_s"] = f"{time.perf_counter() - t0:.0f}"
    log.write(r.stderr[-4000:] + "\n")
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        row["status"] = f"failed: {tail[:120]}"
        return row
    res = json.loads(lines[-1])
    row.update(status="ok", images_per_s=f"{res['images_per_s']:.1f}", step_time_ms=f"{res['step_time_ms']:.2f}",
               mfu_pct="" if res.get("mfu") is None else f"{100 * res['mfu']:.1f}",
               mfu_achievable_pct=("" if res.get("mfu_of_achievable") is None
                                   else f"{100 * res['mfu_of_achievable']:.1f}"),
               peak_mem_gb=f"{res['peak_mem_mb'] / 1024:.2f}", sdpa_backend=res.get("sdpa_backend", ""),
               fused_adamw=res.get("fused_adamw", ""), host_syncs_per_step=res.get("host_syncs_per_step"),
               loss=f"{res['loss']:.4f}")
    row["_result"] = res
    return row


def environment(a: argparse.Namespace) -> dict:
    import torch

    env = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
           "gpu_count": torch.cuda.device_count(), "cpu_smoke": a.cpu_smoke,
           "steps": a.steps, "warmup": a.warmup, "batches": a.batches}
    for mod in ("triton", "timm"):
        spec = importlib.util.find_spec(mod)
        env[mod] = __import__(mod).__version__ if spec else None
    try:
        env["git_commit"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                                           text=True, timeout=5).stdout.strip() or None
    except OSError:
        env["git_commit"] = None
    try:
        env["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        env["nvidia_smi"] = None
    return env


def table(rows: list[dict], env: dict) -> str:
    cols = ["case", "status", "images_per_s", "mfu_pct", "mfu_achievable_pct", "peak_mem_gb", "ratio_to_timm",
            "step_time_ms", "sdpa_backend"]
    heads = ["case", "status", "images/s", "MFU %", "% achievable", "peak GB", "× timm", "ms/step", "SDPA"]
    cells = [[str(r[c]) for c in cols] for r in rows]
    w = [max(len(h), *(len(x[i]) for x in cells)) for i, h in enumerate(heads)]
    title = (f"bench/gpu.sh — {env['gpu'] or 'CPU smoke (no CUDA)'}; torch {env['torch']}, "
             f"timm {env['timm']}, triton {env['triton']}; {env['date']}")
    lines = [title, "  ".join(h.ljust(w[i]) for i, h in enumerate(heads)), "  ".join("-" * x for x in w)]
    lines += ["  ".join(x[i].ljust(w[i]) for i in range(len(heads))).rstrip() for x in cells]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--batches", type=int, nargs="+", default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--peak-tflops", type=float, default=None)
    a = ap.parse_args()
    a.batches = a.batches or ([8, 16] if a.cpu_smoke else [256, 512])
    a.steps = a.steps or (2 if a.cpu_smoke else 30)
    a.warmup = a.warmup if a.warmup is not None else (1 if a.cpu_smoke else 5)
    a.est_compiled_s, a.est_eager_s = (0.0, 0.0) if a.cpu_smoke else (100.0, 35.0)
    a.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    have_timm = importlib.util.find_spec("timm") is not None
    rows = []
    with open(a.out / "log.txt", "w") as log:
        for c in cases(a.batches, a.cpu_smoke, have_timm):
            left = a.budget_s - (time.perf_counter() - start)
            row = run_case(c, a, left, log)
            ips = f", {row['images_per_s']} images/s" if row["status"] == "ok" else ""
            print(f"{row['case']}: {row['status']}{ips}", flush=True)
            rows.append(row)
    timm_ips = {r["batch"]: float(r["images_per_s"]) for r in rows if r["impl"] == "timm" and r["status"] == "ok"}
    for r in rows:
        if r["status"] == "ok" and r["batch"] in timm_ips:
            r["ratio_to_timm"] = f"{float(r['images_per_s']) / timm_ips[r['batch']]:.3f}"
    env = environment(a)
    env["wall_s"] = round(time.perf_counter() - start, 1)
    (a.out / "env.json").write_text(json.dumps(env, indent=1) + "\n")
    (a.out / "results.json").write_text(json.dumps([r.get("_result") | {"case": r["case"]} if r.get("_result")
                                                    else {"case": r["case"], "status": r["status"]}
                                                    for r in rows], indent=1) + "\n")
    with open(a.out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    text = table(rows, env)
    (a.out / "table.txt").write_text(text + "\n")
    print(f"\nwrote {a.out}/results.csv, results.json, env.json, table.txt, log.txt ({env['wall_s']} s)\n")
    print(text, flush=True)
    failed = [r for r in rows if r["status"] not in ("ok",) and not r["status"].startswith("skipped")]
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONPATH", str(ROOT / "src"))
    sys.exit(main())

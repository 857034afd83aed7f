#!/usr/bin/env python3
"""The first GPU hour as one script: does hpctrain run, and how fast, on this GPU (≤ 10 minutes).

Each step runs in its own process under a time budget (a crash, an OOM or a hang costs one step,
never the session) and ends PASS, FAIL or SKIP with its figures and the reason. Everything goes
into `--out DIR`: `gpu_accept.json` (every step's figures, plus the bench records under "results"
for `hpctrain plan --bench-results`), `logs/<step>.log` (each step's output) and the working files
of the training step. A table is printed last. Without a CUDA device the device-independent steps
run at tiny sizes and the rest are SKIPped ("no CUDA device"); `--dry-run` lists the steps and
budgets and imports nothing heavy. No network, no DALI needed (the DALI step SKIPs without it).

  python bench/gpu_accept.py --out DIR [--dry-run] [--only a,b] [--budget-scale X] [--cpu-rehearsal]

`--stack ngc-pytorch-23.12|pytorch-cuda` runs the steps on that recipe's own torch and DALI (its
%labels), in the venv `.ci/stack` builds for it (PyPI: a large download the first time; hpctrain from
this checkout's src/): a step that cannot apply there (FSDP2 on torch 2.2) SKIPs with the reason.

`--cpu-rehearsal` hides any GPU from the steps (CUDA_VISIBLE_DEVICES=""): the run a machine without
one makes, the device-independent steps at tiny sizes, so that the first GPU hour fails only on what
needs a GPU (CI runs it: tests/bench/test_bench_scripts.py).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import functools
import importlib.util
import inspect
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
RESULT = "gpu_accept.json"
NO_CUDA = "no CUDA device"
NO_DALI = "DALI not installed"
# the tiny model of the CPU run (the same as bench/timm_step.py --tiny)
TINY = [
    "model.depth=2",
    "model.width=64",
    "model.heads=2",
    "model.img_size=32",
    "model.patch_size=8",
    "model.num_classes=10",
]


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    budget_s: int  # the subprocess is killed past this (× --budget-scale) and the step FAILs
    cuda_only: bool
    what: str


# In the order they run; the budgets add up to ≤ 600 s (tests/bench/test_bench_scripts.py checks).
STEPS = [
    Step(
        "versions",
        20,
        False,
        "torch/CUDA/cuDNN/NCCL/triton/timm/DALI versions, GPU, driver; whether DALI's "
        "Pipeline takes exec_dynamic and DCP save/async_save/load take no_dist",
    ),
    Step(
        "numerics",
        60,
        False,
        "bf16 autocast vs fp32 forward+backward of ViT-B/16 on one batch, compiled vs eager, each SDPA "
        "kernel's output and gradients vs math (bf16): every error under its stated bound",
    ),
    Step("matmul", 15, True, "bf16 8192² matmul TFLOP/s (CUDA events) against the spec peak; PASS at ≥ 50 %"),
    Step(
        "attention",
        20,
        True,
        "SDPA fwd+bwd at ViT-B/16's shape (256×12×197×64 bf16): flash, efficient, cuDNN, "
        "math, and the kernel auto picks; flash must refuse fp32",
    ),
    Step(
        "bench_eager",
        40,
        False,
        "hpctrain bench ViT-B/16 bf16 eager at batch 256, 128 and 32 (launch-bound): images/s, MFU, memory, "
        "syncs/step (must be 0)",
    ),
    Step(
        "bench_compiled",
        150,
        True,
        "the same, torch.compile'd, at batch 256 and 128: images/s, MFU, memory, syncs/step, compile s",
    ),
    Step("timm", 75, False, "timm vit_base_patch16_224 at the same shape with its best flags; hpctrain/timm"),
    Step(
        "fp16",
        35,
        True,
        "fp16 + GradScaler with fused AdamW, AdamWLowMu, Lamb: skipped steps, syncs, "
        "CUDA vs CPU update on the same inputs",
    ),
    Step(
        "nccl", 30, True, "one-rank NCCL group: DDP with fp32/bf16 comm hooks, FSDP2 sharded sync/async save and reload"
    ),
    Step(
        "train",
        75,
        False,
        "hpctrain train digits (DDP and FSDP on one device): EMA, erasing, async checkpoints, halt + resume vs "
        "straight runs (bit for bit on a CPU), profiler window; on CUDA memory snapshot, NVML, kernel line",
    ),
    Step(
        "jpeg_train",
        60,
        False,
        "ViT-S/16 at 224² on 2,000 JPEGs it writes, 2 epochs through hpctrain train with DALI (nvJPEG) and the "
        "torch loader: the loss falls, images/s and data wait of each, DALI/torch",
    ),
    Step(
        "dali",
        20,
        True,
        "the DALI loader alone: one epoch of jpeg_train's JPEGs at 224² (nvJPEG decode, augmentation on the "
        "GPU), images/s against jpeg_train's training images/s (is the loader the bottleneck?)",
    ),
]
BY_NAME = {s.name: s for s in STEPS}


# =========================================================================== driver (no torch here)


def dry_run(scale: float) -> str:
    lines = [
        f"bench/gpu_accept.py: {len(STEPS)} steps, each in its own process under its budget",
        f"{'#':>2}  {'step':<15}{'budget':>7}  {'needs':<5}  what",
    ]
    for i, s in enumerate(STEPS, 1):
        needs = "CUDA" if s.cuda_only else "any"
        lines.append(f"{i:>2}  {s.name:<15}{s.budget_s * scale:>6.0f}s  {needs:<5}  {s.what}")
    lines.append(f"total budget {sum(s.budget_s for s in STEPS) * scale:.0f} s")
    return "\n".join(lines)


def run_step(step: Step, a: argparse.Namespace, tiny: bool) -> dict:
    """Run one step's worker in a fresh process group, killed (with its children) past its budget."""
    budget = step.budget_s * a.budget_scale
    logs = a.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    res_file = a.out / "steps" / f"{step.name}.json"
    res_file.parent.mkdir(parents=True, exist_ok=True)
    res_file.unlink(missing_ok=True)
    cmd = [
        a.python,
        str(Path(__file__).resolve()),
        "--step",
        step.name,
        "--out",
        str(a.out),
        "--result",
        str(res_file),
        *(["--tiny"] if tiny else []),
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])))
    if a.cpu_rehearsal:
        env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU for the step, whatever the machine has
    if tiny:
        env.setdefault("OMP_NUM_THREADS", "1")  # tiny sizes: a check that everything runs, not a measurement
    t0 = time.perf_counter()
    with open(logs / f"{step.name}.log", "w") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
        try:
            rc = p.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # the worker and whatever it started (hpctrain train runs)
            p.wait()
            rc = None
    wall = time.perf_counter() - t0
    row = {"step": step.name, "budget_s": budget, "wall_s": round(wall, 1), "log": f"logs/{step.name}.log"}
    if rc is None:
        return row | {"status": "FAIL", "reason": f"timeout: killed after its {budget:.3g} s budget", "figures": {}}
    if not res_file.exists():
        tail = (logs / f"{step.name}.log").read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return row | {"status": "FAIL", "reason": f"exit {rc}: {tail[0][:160]}", "figures": {}}
    return row | json.loads(res_file.read_text())


def skip_reason(step: Step, cuda: bool, dali: bool) -> str | None:
    if step.name == "dali" and not dali:
        return NO_DALI
    if step.cuda_only and not cuda:
        return NO_CUDA
    return None


def probe_cuda(python: str, rehearsal: bool = False) -> tuple[bool, bool]:
    """(CUDA device visible, DALI installed) for `python` when the versions step could not say."""
    code = (
        "import importlib.util, torch; print(int(torch.cuda.is_available()), "
        "int(importlib.util.find_spec('nvidia.dali') is not None))"
    )
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60).stdout.split()
    except subprocess.TimeoutExpired:
        out = []
    cuda, dali = (out[0] == "1", out[1] == "1") if len(out) == 2 else (False, False)
    return cuda and not rehearsal, dali


RECIPES = ROOT / "recipes"
STACKS = sorted(p.stem for p in RECIPES.glob("*.def"))  # --stack's choices: the recipes with a stack


def stack_python(name: str) -> str:
    """The Python of the venv `.ci/stack` builds for recipe `name` (built here when missing, reused
    otherwise): that image's torch and DALI, hpctrain from this checkout (the workers' PYTHONPATH)."""
    recipe = RECIPES / f"{name}.def"
    show = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "stack"), str(recipe), "--show"], capture_output=True, text=True, check=True
    ).stdout
    venv = next(ln.split(":", 1)[1].strip() for ln in show.splitlines() if ln.startswith("venv:"))
    subprocess.run([sys.executable, str(ROOT / ".ci" / "stack"), str(recipe), "--prepare"], check=True)
    return str(Path(venv) / "bin" / "python")


def table(rows: list[dict], title: str) -> str:
    heads = ["#", "step", "status", "s / budget", "figures or reason"]
    cells = [
        [
            str(i),
            r["step"],
            r["status"],
            f"{r.get('wall_s', 0):.0f} / {r['budget_s']:.0f}",
            r.get("summary") if r["status"] == "PASS" else (r.get("reason") or r.get("summary") or ""),
        ]
        for i, r in enumerate(rows, 1)
    ]
    w = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    lines = [title, "  ".join(h.ljust(w[i]) for i, h in enumerate(heads)).rstrip(), "  ".join("-" * x for x in w)]
    lines += ["  ".join(c[i].ljust(w[i]) for i in range(len(heads))).rstrip() for c in cells]
    return "\n".join(lines)


def git_commit() -> str | None:
    try:
        return (
            subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def drive(a: argparse.Namespace) -> int:
    a.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    chosen = [s for s in STEPS if not a.only or s.name in a.only]
    rows: list[dict] = []
    cuda = dali = None
    for step in chosen:
        if step.name != "versions" and cuda is None:
            cuda, dali = probe_cuda(a.python, a.cpu_rehearsal)
        why = skip_reason(step, bool(cuda), bool(dali)) if cuda is not None else None
        if why:
            row = {
                "step": step.name,
                "budget_s": step.budget_s * a.budget_scale,
                "wall_s": 0.0,
                "status": "SKIP",
                "reason": why,
                "figures": {},
            }
        else:
            row = run_step(step, a, tiny=not cuda if cuda is not None else False)
        if step.name == "versions" and row["status"] == "PASS":
            cuda, dali = row["figures"]["cuda_available"], row["figures"]["dali"] is not None
        print(f"{step.name}: {row['status']} {row.get('summary') or row.get('reason') or ''}".rstrip(), flush=True)
        rows.append(row)
    by = {r["step"]: r for r in rows}
    ratio_to_timm(by)
    loader_over_training(by)
    results = [
        c["record"] | {"case": c["case"]}
        for r in rows
        if r["status"] == "PASS" and "record" in r["figures"]
        for c in (r["figures"], *r["figures"].get("also", ()))
    ]
    versions = by.get("versions", {}).get("figures", {})
    doc = {
        "script": "bench/gpu_accept.py",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": platform.node(),
        "git_commit": git_commit(),
        "cuda": bool(cuda),
        "cpu_rehearsal": a.cpu_rehearsal,
        "stack": a.stack,  # the recipe whose torch and DALI ran the steps (None: this Python's)
        "gpu": versions.get("gpu_name"),
        "budget_s": sum(s.budget_s for s in chosen) * a.budget_scale,
        "wall_s": round(time.perf_counter() - start, 1),
        "steps": rows,
        "results": results,
    }
    (a.out / RESULT).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    where = "CPU rehearsal (tiny sizes)" if a.cpu_rehearsal else doc["gpu"] or "no CUDA device (tiny sizes)"
    where += f", stack {a.stack}" if a.stack else ""
    title = f"bench/gpu_accept.py — {where}; {doc['wall_s']:.0f} s of {doc['budget_s']:.0f} s budget; {doc['date']}"
    text = table(rows, title)
    (a.out / "table.txt").write_text(text + "\n")
    print(f"\nwrote {a.out / RESULT}, table.txt and logs/\n\n{text}", flush=True)
    return 1 if any(r["status"] == "FAIL" for r in rows) else 0


def loader_over_training(by: dict) -> None:
    """The DALI loader's images/s alone over the DALI training run's (jpeg_train): above 1, the loader
    keeps up with the model."""
    d, j = by.get("dali"), by.get("jpeg_train")
    if not d or not j or d["status"] != "PASS" or j["status"] != "PASS":
        return
    trained = j["figures"].get("loaders", {}).get("dali", {}).get("images_per_s")
    if trained:
        d["figures"]["loader_over_training"] = d["figures"]["images_per_s"] / trained
        d["summary"] += f"; loader/training {d['figures']['loader_over_training']:.2f}×"


def ratio_to_timm(by: dict) -> None:
    """hpctrain's images/s over timm's at the same shape (compiled on a GPU; eager at tiny sizes)."""
    t = by.get("timm")
    if not t or t["status"] != "PASS":
        return
    mine = by.get("bench_compiled") if t["figures"]["compile"] else by.get("bench_eager")
    if mine and mine["status"] == "PASS":
        r = mine["figures"]["images_per_s"] / t["figures"]["images_per_s"]
        t["figures"]["hpctrain_over_timm"] = r
        t["figures"]["hpctrain_case"] = mine["figures"]["case"]
        t["summary"] += f"; hpctrain/timm {r:.3f} ({mine['step']})"


# =========================================================================== workers (one per step)
# Workers import torch, and hpctrain (from src/, put on the path by `work`), inside their functions:
# the driver and --dry-run run on any machine without torch.


def passed(summary: str, **figures) -> dict:
    return {"status": "PASS", "summary": summary, "figures": figures}


def failed(reason: str, summary: str = "", **figures) -> dict:
    return {"status": "FAIL", "reason": reason, "summary": summary, "figures": figures}


def skipped(reason: str, **figures) -> dict:
    """A step that cannot apply here (an older torch), said as such, not as a FAIL."""
    return {"status": "SKIP", "reason": reason, "figures": figures}


def fsdp_torch() -> str | None:
    """Why FSDP2 and DCP's async saves cannot run on this torch (None: they can: 2.4+)."""
    import torch

    from hpctrain.train import compat

    if compat.version_tuple() >= compat.FSDP_MIN_TORCH:
        return None
    return f"FSDP2 and async sharded saves need torch >= 2.4; this is {torch.__version__}"


def version_of(module: str) -> str | None:
    if importlib.util.find_spec(module.split(".")[0]) is None:
        return None
    try:
        return getattr(__import__(module, fromlist=["__version__"]), "__version__", "?")
    except Exception as e:  # noqa: BLE001 - a broken install is a figure here, not a crash
        return f"import fails: {e}"


def takes(fn, arg: str) -> bool | None:
    try:
        return arg in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None


def w_versions(tiny: bool, out: Path) -> dict:
    import torch  # heavy: workers only (the driver and --dry-run import no torch)

    cuda = torch.cuda.is_available()
    f = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": None,
        "triton": version_of("triton"),
        "timm": version_of("timm"),
        "dali": version_of("nvidia.dali"),
        "cuda_available": cuda,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "gpu_name": torch.cuda.get_device_name(0) if cuda else None,
        "driver": None,
        "hpctrain": version_of("hpctrain"),
    }
    with contextlib.suppress(Exception):  # a CPU build has no NCCL
        v = torch.cuda.nccl.version()
        f["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    if shutil.which("nvidia-smi"):
        r = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=driver_version,memory.total,power.limit,clocks.max.sm",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=20,
        )
        first = r.stdout.strip().splitlines()[:1]
        if first:
            f["driver"], f["memory_total"], f["power_limit"], f["max_sm_clock"] = [
                x.strip() for x in first[0].split(",")
            ] + [None] * (4 - len(first[0].split(",")))
    import torch.distributed.checkpoint as dcp  # heavy (~2 s): this step only

    f["dcp_no_dist"] = {
        fn: takes(getattr(dcp, fn), "no_dist") if hasattr(dcp, fn) else None for fn in ("save", "async_save", "load")
    }
    f["dali_exec_dynamic"] = None
    if f["dali"] is not None:
        from nvidia.dali import Pipeline  # DALI: optional, only when installed

        f["dali_exec_dynamic"] = takes(Pipeline.__init__, "exec_dynamic")
    nd = ", ".join(f"{k} {'yes' if v else 'no' if v is False else '-'}" for k, v in f["dcp_no_dist"].items())
    summary = (
        f"torch {f['torch']}, CUDA {f['cuda']}, cuDNN {f['cudnn']}, NCCL {f['nccl']}, triton {f['triton']}, "
        f"timm {f['timm']}, DALI {f['dali']}; {f['gpu_name'] or 'no GPU'} (driver {f['driver']}); "
        f"no_dist: {nd}; exec_dynamic: {f['dali_exec_dynamic']}"
    )
    return passed(summary, **f)


def w_matmul(tiny: bool, out: Path) -> dict:
    import torch  # heavy: workers only

    from hpctrain import flops

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    n, iters = (256, 3) if tiny else (8192, 50)
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    if cuda:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        s.record()
        for _ in range(iters):
            a @ b
        e.record()
        e.synchronize()
        ms = s.elapsed_time(e)
    else:
        t = time.perf_counter()
        for _ in range(iters):
            a @ b
        ms = 1000 * (time.perf_counter() - t)
    tflops = 2 * n**3 * iters / (ms / 1000) / 1e12
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    peak, source = flops.peak_tflops(name) if cuda else (None, "cpu")
    frac = tflops / peak if peak else None
    f = {
        "n": n,
        "iters": iters,
        "ms_per_matmul": ms / iters,
        "tflops": tflops,
        "peak_tflops": peak,
        "peak_source": source,
        "of_peak": frac,
        "achievable_table": flops.achievable_tflops(name),
    }
    summary = f"{tflops:.3g} TFLOP/s bf16 {n}²" + (f" = {100 * frac:.0f} % of {peak:g} spec" if frac else "")
    if frac is not None and frac < 0.5:
        return failed(f"{summary}: under half the spec peak (clocks, power cap, another process?)", summary, **f)
    return passed(summary, **f)


def w_attention(tiny: bool, out: Path) -> dict:
    import torch  # heavy: workers only
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    from hpctrain.train import compat
    from hpctrain.train.fastpath import SDPA_OPS

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    shape = (4, 2, 17, 16) if tiny else (256, 12, 197, 64)  # ViT-B/16: batch × heads × tokens × head dim
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(shape, device=dev, dtype=torch.bfloat16, generator=g).requires_grad_() for _ in range(3))
    b = torch.backends.cuda

    def use(kernel: str) -> None:
        """The process-wide switches (in every supported torch, unlike the context managers)."""
        if kernel != "auto":
            compat.set_sdpa_backend(kernel)
            return
        b.enable_flash_sdp(True), b.enable_mem_efficient_sdp(True), b.enable_math_sdp(True)
        if hasattr(b, "enable_cudnn_sdp"):
            b.enable_cudnn_sdp(True)

    def fwd_bwd():
        F.scaled_dot_product_attention(q, k, v).sum().backward()

    def timed() -> float:
        for _ in range(2):
            fwd_bwd()
        n = 3 if tiny else 10
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fwd_bwd()
        if cuda:
            torch.cuda.synchronize()
        return 1000 * (time.perf_counter() - t) / n

    f: dict = {"shape": list(shape), "dtype": "bf16", "ms_fwd_bwd": {}, "unavailable": {}}
    for name in ("flash", "efficient", "cudnn", "math", "auto"):
        try:
            use(name)
            f["ms_fwd_bwd"][name] = timed()
        except Exception as e:  # noqa: BLE001 - a kernel this GPU/torch lacks is a figure, not a crash
            f["unavailable"][name] = str(e).strip().splitlines()[0][:200]
    use("auto")
    seen: set[str] = set()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with Record():
        F.scaled_dot_product_attention(q, k, v)
    f["auto_picks"] = ", ".join(n for op, n in SDPA_OPS.items() if op in seen) or "none"
    use("flash")
    try:
        F.scaled_dot_product_attention(q.float(), k.float(), v.float())
        f["flash_fp32"] = "ran (not refused)"
    except RuntimeError as e:
        f["flash_fp32"] = f"raises: {str(e).strip().splitlines()[0][:160]}"
    use("auto")
    ms = ", ".join(f"{k} {v:.2f}" for k, v in f["ms_fwd_bwd"].items())
    refused = "refused" if f["flash_fp32"].startswith("raises") else "accepted"
    summary = f"ms fwd+bwd: {ms}; auto picks {f['auto_picks']}; flash with fp32 {refused}"
    if not cuda:
        return passed(summary, **f)
    problems = [f"{k} unavailable" for k in ("flash", "auto") if k in f["unavailable"]]
    if "math" in f["auto_picks"]:
        problems.append("auto picks math")
    if not f["flash_fp32"].startswith("raises"):
        problems.append("flash accepted fp32")
    return failed("; ".join(problems), summary, **f) if problems else passed(summary, **f)


# The numerics step's bounds: max |a - b| / max |ref| over a tensor (a relative error against the
# reference's scale, so a near-zero element does not blow it up). bf16 keeps 8 bits of mantissa
# (2^-8 = 0.4 % per rounding); a ViT-B forward chains ~12 blocks of them, and its gradients go
# through the same chain backward: a few percent is bf16 working, tens of percent a broken kernel.
LOSS_FALL = 0.7  # the jpeg step: the last logged loss at most this × the first (colours a model learns in ~30 steps)
BOUNDS = {"bf16_logits": 0.05, "bf16_grads": 0.10, "compiled": 1e-3, "sdpa_out": 0.02, "sdpa_grads": 0.05}


def rel_err(a, ref) -> float:
    """max |a - ref| / max |ref| in float64 (0 for a zero reference equal to a)."""
    a, ref = a.double(), ref.double()
    scale = ref.abs().max().item()
    return (a - ref).abs().max().item() / scale if scale else float((a - ref).abs().max().item())


def w_numerics(tiny: bool, out: Path) -> dict:
    """bf16 autocast against fp32 (forward and backward of the model on one batch), compiled against
    eager (fp32), and each SDPA kernel's output and gradients against the math kernel's (bf16, at
    ViT-B/16's attention shape): every figure against its bound (BOUNDS)."""
    import torch  # heavy: workers only
    import torch.nn.functional as F

    from hpctrain.config import load
    from hpctrain.models.vit import build_vit
    from hpctrain.train import compat

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    cfg = load("bench_vit_b16", [*TINY, "model.depth=1"] if tiny else [])
    torch.manual_seed(0)
    model = build_vit(cfg.model).to(dev)
    torch.nn.init.normal_(model.head.weight, std=0.02)  # a zero head (the usual init) would hide the logits' error
    batch = 4 if tiny else 32
    x = torch.randn(batch, 3, cfg.model.img_size, cfg.model.img_size, device=dev)
    y = torch.randint(0, cfg.model.num_classes, (batch,), device=dev)

    def fwd_bwd(m, amp: bool):
        m.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            logits = m(x)
        F.cross_entropy(logits.float(), y).backward()
        return logits.detach().float(), [p.grad.detach().float().clone() for p in m.parameters()]

    f: dict = {"model": f"depth {cfg.model.depth}, width {cfg.model.width}, {cfg.model.img_size}²", "batch": batch}
    f["bounds"] = BOUNDS
    ref_logits, ref_grads = fwd_bwd(model, False)
    logits, grads = fwd_bwd(model, True)
    f["bf16_logits"] = rel_err(logits, ref_logits)
    f["bf16_grads"] = max(rel_err(g, r) for g, r in zip(grads, ref_grads))
    compiled = torch.compile(model)
    t0 = time.perf_counter()
    c_logits, c_grads = fwd_bwd(compiled, False)
    f["compile_s"] = round(time.perf_counter() - t0, 1)
    f["compiled"] = max(rel_err(c_logits, ref_logits), *(rel_err(g, r) for g, r in zip(c_grads, ref_grads)))
    shape = (4, 2, 17, 16) if tiny else (8, 12, 197, 64)  # batch × heads × tokens × head dim
    g = torch.Generator(device=dev).manual_seed(0)
    qkv = [torch.randn(shape, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3)]
    grad_out = torch.randn(shape, device=dev, dtype=torch.bfloat16, generator=g)

    def attention(kernel: str):
        compat.set_sdpa_backend(kernel)
        q, k, v = (t.clone().requires_grad_() for t in qkv)
        o = F.scaled_dot_product_attention(q, k, v)
        o.backward(grad_out)
        return o.detach(), [q.grad, k.grad, v.grad]

    ref_o, ref_g = attention("math")
    f["sdpa"], f["sdpa_unavailable"] = {}, {}
    for kernel in ("flash", "efficient", "cudnn"):
        try:
            o, gs = attention(kernel)
        except Exception as e:  # noqa: BLE001 - a kernel this device or torch lacks: a figure, not a failure
            f["sdpa_unavailable"][kernel] = str(e).strip().splitlines()[0][:160]
            continue
        f["sdpa"][kernel] = {"out": rel_err(o, ref_o), "grads": max(rel_err(a, b) for a, b in zip(gs, ref_g))}
    compat.set_sdpa_backend("auto")
    over = [f"{k} {f[k]:.2g} > {BOUNDS[k]:g}" for k in ("bf16_logits", "bf16_grads", "compiled") if f[k] > BOUNDS[k]]
    for kernel, e in f["sdpa"].items():
        over += [
            f"{kernel} {w} {e[w]:.2g} > {BOUNDS['sdpa_' + w]:g}" for w in ("out", "grads") if e[w] > BOUNDS[f"sdpa_{w}"]
        ]
        over += [f"{kernel} {w} not finite" for w in ("out", "grads") if not math.isfinite(e[w])]
    sdpa = ", ".join(f"{k} {e['out']:.1e}/{e['grads']:.1e}" for k, e in f["sdpa"].items()) or "none but math"
    summary = (
        f"bf16 vs fp32: logits {f['bf16_logits']:.1e}, grads {f['bf16_grads']:.1e}; compiled vs eager "
        f"{f['compiled']:.1e} ({f['compile_s']:.0f} s to compile); SDPA vs math (out/grads): {sdpa}"
    )
    if cuda and "flash" in f["sdpa_unavailable"]:
        over.append("flash unavailable on CUDA")
    return failed("; ".join(over), summary, **f) if over else passed(summary, **f)


def bench_case(tiny: bool, batch: int, compiled: bool) -> dict:
    """One row of the speed table: `hpctrain bench`'s record at one per-GPU batch, eager or compiled."""
    from hpctrain.bench import measure  # torch under it: workers only
    from hpctrain.config import load

    sets = [f"data.global_batch={batch}", f"compile.enabled={str(compiled).lower()}", *(TINY if tiny else [])]
    if tiny:
        sets.append("train.device=cpu")
    steps, warmup = (2, 1) if tiny else (30 if batch >= 128 else 50, 5)
    r = measure(load("bench_vit_b16", sets), steps=steps, warmup=warmup, config_name="bench_vit_b16")
    return {
        "case": f"hpctrain-{'compiled' if compiled else 'eager'}-b{batch}",
        "batch": batch,
        "compile": compiled,
        "images_per_s": r["images_per_s"],
        "mfu": r["mfu"],
        "mfu_of_achievable": r["mfu_of_achievable"],
        "peak_mem_mb": r["peak_mem_mb"],
        "host_syncs_per_step": r["host_syncs_per_step"],
        "compile_s": r["compile_s"],
        "first_step_s": r["first_step_s"],
        "sdpa_backend": r["sdpa_backend"],
        "fused_adamw": r["fused_adamw"],
        "loss": r["loss"],
        "record": r,
    }


def case_text(c: dict) -> str:
    mfu = f", MFU {100 * c['mfu']:.1f} %" if c["mfu"] is not None else ""
    comp = f", compile {c['compile_s']:.0f} s" if c["compile_s"] is not None else ""
    return (
        f"b{c['batch']}: {c['images_per_s']:.0f} img/s{mfu}, {c['peak_mem_mb'] / 1024:.1f} GB, "
        f"syncs/step {c['host_syncs_per_step']}{comp}"
    )


def bench_cases(tiny: bool, batches: tuple[int, ...], compiled: bool) -> dict:
    """The speed table's rows at each batch, in one process. The first batch's figures are the step's own
    (timm's ratio and earlier readers take them); the others go under "also", each with its record."""
    cases = [bench_case(tiny, b, compiled) for b in batches]
    summary = "; ".join(case_text(c) for c in cases) + f"; SDPA {cases[0]['sdpa_backend']}"
    f = cases[0] | {"also": cases[1:]}
    over = [
        f"b{c['batch']} {c['host_syncs_per_step']} host syncs in the step (must be 0)"
        for c in cases
        if c["host_syncs_per_step"]
    ]
    over += [f"b{c['batch']} loss {c['loss']}" for c in cases if c["loss"] is None or not math.isfinite(c["loss"])]
    return failed(f"{summary}: {'; '.join(over)}", summary, **f) if over else passed(summary, **f)


def w_bench_eager(tiny: bool, out: Path) -> dict:
    return bench_cases(tiny, (8, 6, 4) if tiny else (256, 128, 32), False)


def w_bench_compiled(tiny: bool, out: Path) -> dict:
    return bench_cases(tiny, (8, 6) if tiny else (256, 128), True)


def w_timm(tiny: bool, out: Path) -> dict:
    if importlib.util.find_spec("timm") is None:
        return {"status": "SKIP", "reason": "timm not installed", "figures": {}}
    spec = importlib.util.spec_from_file_location("timm_step", ROOT / "bench" / "timm_step.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    batch = 8 if tiny else 256
    r = mod.measure(batch=batch, steps=2 if tiny else 30, warmup=1 if tiny else 5, compile=not tiny, tiny=tiny)
    f = {
        "case": f"timm-{'compiled' if r['compile'] else 'eager'}-b{batch}",
        "compile": r["compile"],
        "images_per_s": r["images_per_s"],
        "mfu": r["mfu"],
        "peak_mem_mb": r["peak_mem_mb"],
        "compile_s": r["compile_s"],
        "sdpa_backend": r["sdpa_backend"],
        "timm": r["timm"],
        "record": r,
    }
    mfu = f", MFU {100 * r['mfu']:.1f} %" if r["mfu"] is not None else ""
    return passed(
        f"timm {r['timm']} b{batch} {'compiled' if r['compile'] else 'eager'}: {r['images_per_s']:.0f} img/s{mfu}", **f
    )


def make_trainer(cfg, device):
    """A Trainer on synthetic batches, as `hpctrain bench` builds it (no run directory)."""
    import torch  # heavy: workers only

    from hpctrain.data.build import build_loaders
    from hpctrain.models.vit import build_vit
    from hpctrain.train import dist as distmod
    from hpctrain.train.loop import build_trainer

    torch.manual_seed(cfg.train.seed)
    model = build_vit(cfg.model)  # on the CPU, before anything draws: every device starts from these weights
    loader, _ = build_loaders(cfg, 0, 1, device)
    return build_trainer(cfg, distmod.DistInfo(), device, None, loader, None, model)


def sync_count(fn) -> int:
    """Device→host synchronisations while `fn` runs (CUDA sync debug mode)."""
    import torch  # heavy: workers only

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message).lower() for w in caught)


def w_fp16(tiny: bool, out: Path) -> dict:
    import torch  # heavy: workers only

    from hpctrain.config import load

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    # small enough that three CPU steps per optimizer fit the budget (CPU fp16 matmuls are slow)
    model = [
        "model.depth=4",
        "model.width=192",
        "model.heads=3",
        "model.img_size=32",
        "model.patch_size=4",
        "model.num_classes=100",
    ]
    base = [
        "data.loader=synthetic",
        "data.global_batch=32",
        "data.synthetic_size=4096",
        "train.amp=fp16",
        "compile.enabled=false",
        "optim.warmup_steps=0",
        "optim.lr=1e-3",
        *(TINY if tiny else model),
    ]
    optims = {
        "adamw_fused": ["optim.name=adamw", "optim.fused=always"],
        "adamw_low_mu": ["optim.name=adamw", "optim.mu_dtype=bf16"],
        "lamb": ["optim.name=lamb"],
    }
    n_steps = 3 if tiny else 20
    f: dict = {}
    for name, sets in optims.items():
        cfg = load("bench_vit_b16", base + sets)
        tr = make_trainer(cfg, dev)
        batches = [next(iter(tr.train_loader)) for _ in range(1)]
        init = tr.scaler.get_scale()
        for _ in range(n_steps):
            tr.train_step(batches)
            tr.step += 1
        syncs = sync_count(functools.partial(tr.train_step, batches)) if cuda else None
        loss = float(tr.train_step(batches))
        # the scale halves at every skipped step and grows only after 2000 clean ones
        skipped = round(math.log2(init / tr.scaler.get_scale()))
        f[name] = {
            "skipped_steps": skipped,
            "of_steps": n_steps + 1 + int(cuda),
            "host_syncs_per_step": syncs,
            "loss": loss,
            "fused": bool(tr.optimizer.defaults.get("fused")),
        }
        try:
            f[name]["update_rel_diff_vs_cpu"] = update_vs_cpu(cfg, dev, batches)
        except Exception as e:  # noqa: BLE001 - e.g. no fp16 autocast on this torch's CPU: a figure, not a crash
            f[name]["update_rel_diff_vs_cpu"], f[name]["cpu_error"] = None, f"{type(e).__name__}: {e}"[:200]
    diff = {k: v["update_rel_diff_vs_cpu"] for k, v in f.items()}
    summary = "; ".join(
        f"{k}: skipped {v['skipped_steps']}/{v['of_steps']}, syncs {v['host_syncs_per_step']}, "
        f"Δ vs CPU {'-' if diff[k] is None else f'{diff[k]:.1e}'}"
        for k, v in f.items()
    )
    problems = [f"{k}: loss {v['loss']}" for k, v in f.items() if not math.isfinite(v["loss"])]
    problems += [
        f"{k}: update differs from the CPU's by {d:.2f} (> 0.1)" for k, d in diff.items() if d is not None and d > 0.1
    ]
    return failed("; ".join(problems), summary, **f) if problems else passed(summary, **f)


def update_vs_cpu(cfg, dev, batches) -> float:
    """The same 3 steps from the same weights and inputs on `dev` and on the CPU: the relative
    difference of the two weight updates (0 when `dev` is the CPU)."""
    import torch  # heavy: workers only

    batches = [(x[:16], y[:16]) for x, y in batches]  # 16 images: fp16 on a CPU is slow
    cpu_batches = [(x.cpu(), y.cpu()) for x, y in batches]
    deltas = []
    for d, bs in ((dev, batches), (torch.device("cpu"), cpu_batches)):
        t = make_trainer(cfg, d)
        before = [p.detach().float().cpu().clone() for p in t.model.parameters()]
        for _ in range(3):
            t.train_step(bs)
            t.step += 1
        deltas.append(
            torch.cat([(p.detach().float().cpu() - b).flatten() for p, b in zip(t.model.parameters(), before)])
        )
    return float((deltas[0] - deltas[1]).norm() / deltas[1].norm().clamp_min(1e-30))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def full(t):
    """A parameter as a whole tensor on the CPU (FSDP2's are DTensors holding a shard)."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().float().cpu().clone()  # never a view


def w_nccl(tiny: bool, out: Path) -> dict:
    import torch  # heavy: workers only

    if why := fsdp_torch():  # the NGC 23.12 stack (torch 2.2): its FSDP2 and DCP halves cannot run
        return skipped(why)
    import torch.distributed as td

    from hpctrain.config import load
    from hpctrain.models.vit import build_vit
    from hpctrain.train import comm, fsdp
    from hpctrain.train.ckpt import sharded
    from hpctrain.train.collective import shutdown

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    td.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=60),
    )
    f: dict = {"backend": td.get_backend()}
    try:
        cfg = load("digits_vit", ["train.amp=bf16"])
        torch.manual_seed(0)
        ref = build_vit(cfg.model).to(dev)
        x = torch.randn(32, 3, 32, 32, device=dev)
        y = torch.randint(0, 10, (32,), device=dev)
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        used = [n for n, p in ref.named_parameters() if p.grad is not None]  # cls_token is unused with avg pool
        want = torch.cat([ref.get_parameter(n).grad.flatten() for n in used])
        for dtype in ("fp32", "bf16"):
            model = copy.deepcopy(ref)
            model.zero_grad(set_to_none=True)
            ddp, hook = comm.wrap(
                model, dev, dataclasses.replace(cfg, dist=dataclasses.replace(cfg.dist, grad_reduce_dtype=dtype))
            )
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            got = torch.cat([model.get_parameter(n).grad.flatten() for n in used])
            f[f"ddp_{dtype}"] = {"grad_rel_diff": float((got - want).norm() / want.norm()), "bytes": hook.take()}
            del ddp
        f["bf16_bytes_ratio"] = f["ddp_bf16"]["bytes"] / max(1, f["ddp_fp32"]["bytes"])
        # FSDP2 (bf16 mixed precision), two steps, a sync save, one step, an async save, reload both
        torch.manual_seed(0)
        model = build_vit(cfg.model)
        fsdp.shard(model, dev, True, "bf16")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def train_step(m, o):
            torch.nn.functional.cross_entropy(m(x), y).backward()
            o.step()
            o.zero_grad(set_to_none=True)

        for _ in range(2):
            train_step(model, opt)
        run_dir = out / "nccl_run"
        shutil.rmtree(run_dir, ignore_errors=True)
        snaps, paths = [], []
        for step, background in ((2, False), (3, True)):
            if step == 3:
                train_step(model, opt)
            snaps.append([full(p) for p in model.parameters()])
            m, o, groups = sharded.model_optim_state(model, opt)
            meta = {"step": step, "param_groups": groups}
            t = time.perf_counter()
            if background:
                gloo = td.new_group(backend="gloo")  # async_save's collectives run on its own thread and group
                pending = sharded.start(run_dir, step, {"model": m, "optim": o}, meta, 3, True, group=gloo)
                f["async_blocking_s"] = time.perf_counter() - t
                path, err = pending.wait()
                f["async_total_s"] = time.perf_counter() - t
            else:
                path, err = sharded.save(run_dir, step, {"model": m, "optim": o}, meta, 3, True)
                f["sync_save_s"] = time.perf_counter() - t
            if err:
                raise err
            paths.append(path)
        f["ckpt_mb"] = sum(p.stat().st_size for p in paths[0].rglob("*") if p.is_file()) / 2**20
        after = []
        for path in paths:
            torch.manual_seed(1)  # other initial weights: the load must replace them
            m2 = build_vit(cfg.model)
            fsdp.shard(m2, dev, True, "bf16")
            o2 = torch.optim.AdamW(m2.parameters(), lr=1e-3)
            t = time.perf_counter()
            groups = torch.load(path / "meta.pt", weights_only=True)["param_groups"]
            sharded.load_into(path, m2, o2, None, groups)
            f.setdefault("load_s", []).append(time.perf_counter() - t)
            after.append((m2, o2))
        f["reload_max_abs_diff"] = [
            max(float((full(p) - s).abs().max()) for p, s in zip(m2.parameters(), snap))
            for (m2, _), snap in zip(after, snaps)
        ]
        # the step-2 checkpoint plus the step the original took: the optimizer state came back too
        train_step(*after[0])
        num = sum(float((full(p) - s).norm() ** 2) for p, s in zip(after[0][0].parameters(), snaps[1])) ** 0.5
        den = sum(float((s - s0).norm() ** 2) for s, s0 in zip(snaps[1], snaps[0])) ** 0.5
        f["resumed_step_rel_diff"] = num / max(den, 1e-30)
    finally:
        shutdown()
    summary = (
        f"{f['backend']}: DDP grads Δ fp32 {f['ddp_fp32']['grad_rel_diff']:.1e}, bf16 "
        f"{f['ddp_bf16']['grad_rel_diff']:.1e} (bytes ×{f['bf16_bytes_ratio']:.2f}); FSDP2 save "
        f"{f['sync_save_s']:.2f} s, async {f['async_blocking_s']:.2f}/{f['async_total_s']:.2f} s, "
        f"reload Δ {max(f['reload_max_abs_diff']):.1e}, resumed step Δ {f['resumed_step_rel_diff']:.1e}"
    )
    problems = []
    if f["ddp_fp32"]["grad_rel_diff"] > 1e-5:
        problems.append("DDP fp32 gradients differ from the model's own")
    if not 0 < f["ddp_bf16"]["grad_rel_diff"] < 1e-2:
        problems.append("DDP bf16 gradients are not the bf16-rounded ones")
    if f["bf16_bytes_ratio"] != 0.5:
        problems.append("the bf16 hook does not send half the bytes")
    if max(f["reload_max_abs_diff"]) > 1e-6:
        problems.append("reloaded weights differ from the saved ones")
    if f["resumed_step_rel_diff"] > 1e-2:
        problems.append("a step after reload differs from the original's (optimizer state?)")
    return failed("; ".join(problems), summary, **f) if problems else passed(summary, **f)


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().startswith("{")]


def last_train(recs: list[dict]) -> dict:
    train = [r for r in recs if r.get("kind") == "train"]
    return max(train, key=lambda r: r["step"]) if train else {}


def w_train(tiny: bool, out: Path) -> dict:
    import torch  # heavy: workers only (the device decides the sets)

    cuda = torch.cuda.is_available()
    work = out / "train"
    shutil.rmtree(work, ignore_errors=True)
    data, runs = work / "data", work / "runs"
    env = dict(os.environ)
    hp = [sys.executable, "-m", "hpctrain"]
    subprocess.run([*hp, "data", "digits", str(data)], check=True, env=env, capture_output=True, timeout=120)
    steps, halt = (6, 3) if tiny else (60, 30)
    old_torch = fsdp_torch()  # torch 2.2: DDP only, synchronous saves
    common = [
        f"data.root={data}",
        "data.prepare=none",
        f"run.dir={runs}",
        f"train.max_steps={steps}",
        "log.every=2" if tiny else "log.every=10",
        "train.eval_every_epochs=0",
        "train.ema=0.99",
        "aug.erase_prob=0.25",
        f"ckpt.async_save={'false' if old_torch else 'true'}",
        f"ckpt.every={halt // 2 or 1}",
        "log.trackers=[]",
        f"train.amp={'bf16' if cuda else 'none'}",
    ]
    runs_sets = {
        "a": [
            "log.profile_steps=2-3" if tiny else "log.profile_steps=5-7",
            "log.memory_snapshot_steps=4-4" if tiny else "log.memory_snapshot_steps=8-9",
        ],
        "b": [],
        "h": [f"--halt-at={halt}"],
    }
    if not old_torch:  # FSDP on one device (a process group of one: its gathers, casts and DTensor optimizer step)
        runs_sets |= {
            "f": ["dist.parallel=fsdp", "train.ema=0"],
            "fh": ["dist.parallel=fsdp", "train.ema=0", f"--halt-at={halt}"],
        }

    def cmd(name: str, sets: list[str]) -> list[str]:
        c = [*hp, "train", "--config", "digits_vit"]
        for s in (*common, f"run.name={name}", *sets):
            c += [s] if s.startswith("--") else ["--set", s]
        return c

    t = time.perf_counter()
    procs = {
        n: subprocess.Popen(cmd(n, s), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for n, s in runs_sets.items()
    }  # five small runs share the GPU: the step's budget is short
    outs = {n: p.communicate() for n, p in procs.items()}
    rcs = {n: p.returncode for n, p in procs.items()}
    fsdp = ["dist.parallel=fsdp", "train.ema=0"]
    resumes = {
        n: subprocess.Popen(cmd(n, s), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for n, s in (("h", []), ("fh", fsdp))
        if n in runs_sets
    }
    for n, p in resumes.items():
        outs[f"{n}_resume"] = p.communicate()
        rcs[f"{n}_resume"] = p.returncode
    wall = time.perf_counter() - t
    for n, (o, _) in outs.items():
        print(f"===== run {n} (exit {rcs[n]})\n{o[-4000:]}")
    if any(rcs.values()):
        return failed(f"hpctrain train exits {rcs}", "", exit_codes=rcs)
    recs = {n: read_metrics(runs / n / "metrics.jsonl") for n in runs_sets}
    final = {n: last_train(r) for n, r in recs.items()}
    loss = {n: final[n].get("loss") for n in final}
    f: dict = {
        "steps": steps,
        "halt_at": halt,
        "wall_s": wall,
        "final_step": {n: final[n].get("step") for n in final},
        "final_loss": loss,
    }
    problems = []
    # a halt and a resume change no number: bit for bit on the CPU (deterministic kernels); on a GPU the
    # straight runs differ from each other already (atomics in some backward kernels), so within that
    fsdp = "f" in recs
    f["fsdp_final_loss"] = {"straight": loss["f"], "resumed": loss["fh"]} if fsdp else old_torch
    if not cuda:
        for straight, resumed in (("b", "h"), ("f", "fh"))[: 2 if fsdp else 1]:
            if loss[straight] != loss[resumed]:
                problems.append(
                    f"run {resumed} resumed ends at loss {loss[resumed]!r}, not {loss[straight]!r} bit for bit"
                )
    if len({final[n].get("step") for n in final}) != 1 or final["a"].get("step") != steps:
        problems.append(f"runs ended at steps {f['final_step']}, not all at {steps}")
    h_log = runs / "h" / "logs" / "rank-0.log"
    h_text = h_log.read_text(errors="replace") if h_log.exists() else ""
    f["halted_at"] = [r["step"] for r in recs["h"] if r.get("kind") == "stop"]
    f["resumed"] = f"at step {halt}" in "".join(ln for ln in h_text.splitlines() if "resumed from" in ln)
    if f["halted_at"] != [halt] or not f["resumed"]:
        problems.append(f"run h: stop records at {f['halted_at']}, resumed from step {halt}: {f['resumed']}")
    fsdp_gap = abs(loss["fh"] - loss["f"]) if fsdp and None not in (loss["f"], loss["fh"]) else None
    f["fsdp_resumed_gap"] = fsdp_gap
    if fsdp and [r["step"] for r in recs["fh"] if r.get("kind") == "stop"] != [halt]:
        problems.append(f"FSDP run fh did not halt at step {halt}")
    noise = abs(loss["a"] - loss["b"]) if None not in (loss["a"], loss["b"]) else None
    gap = abs(loss["h"] - loss["a"]) if None not in (loss["h"], loss["a"]) else None
    # no bitwise equality on a GPU: the resumed run must be as close to a straight one as two straight runs
    # are to each other, with a floor for runs that happen to match exactly
    tol = max(2 * noise, 2e-3 * abs(loss["a"])) if noise is not None else None
    f.update(run_to_run_noise=noise, resumed_gap=gap, tolerance=tol)
    if gap is None or gap > tol:
        problems.append(f"resumed final loss {loss['h']} vs straight {loss['a']}: gap {gap} > tolerance {tol}")
    if fsdp and (fsdp_gap is None or tol is None or fsdp_gap > tol):
        problems.append(f"FSDP resumed final loss {loss['fh']} vs straight {loss['f']}: gap {fsdp_gap} > {tol}")
    a_log = runs / "a" / "logs" / "rank-0.log"
    log_text = a_log.read_text(errors="replace") if a_log.exists() else ""
    kernel = [ln.split("attention kernel:", 1)[1].strip() for ln in log_text.splitlines() if "attention kernel:" in ln]
    f["kernel_line"] = kernel[0] if kernel else None
    prof = runs / "a" / "profile"
    f["traces"] = {p.name: p.stat().st_size for p in sorted(prof.glob("*"))} if prof.is_dir() else {}
    f["trace_bytes"] = sum(v for k, v in f["traces"].items() if ".trace." in k)
    f["snapshot_bytes"] = sum(v for k, v in f["traces"].items() if k.startswith("memory-"))
    gpus = [r.get("gpus") for r in recs["a"] if r.get("kind") == "train" and r.get("gpus")]
    f["nvml_fields"] = sorted(gpus[-1][0]) if gpus else []
    if not f["trace_bytes"]:
        problems.append("no profiler trace")
    if cuda:
        if not kernel:
            problems.append("no 'attention kernel:' line in logs/rank-0.log")
        if not f["snapshot_bytes"]:
            problems.append("no memory snapshot")
        missing = {"util_pct", "mem_used_gb", "power_w", "sm_clock_mhz"} - set(f["nvml_fields"])
        if missing:
            problems.append(f"NVML fields missing from the train records: {sorted(missing)} (pynvml installed?)")
    summary = (
        (
            f"loss straight {loss['a']:.4f}/{loss['b']:.4f}, resumed {loss['h']:.4f} (gap {gap:.1e}, noise "
            f"{noise:.1e}); "
            + (f"FSDP {loss['f']:.4f}, resumed {loss['fh']:.4f}; " if fsdp else "no FSDP (torch < 2.4); ")
            + f"kernel {f['kernel_line']}; "
            f"trace {f['trace_bytes'] / 1e6:.1f} MB, snapshot "
            f"{f['snapshot_bytes'] / 1e6:.1f} MB; NVML {','.join(f['nvml_fields']) or '-'}"
        )
        if None not in (gap, noise)
        else f"losses {loss}"
    )
    return failed("; ".join(problems), summary, **f) if problems else passed(summary, **f)


def write_jpegs(root: Path, classes: int, per_class: int, size: int, seed: int = 0) -> int:
    """An ImageNet-layout folder of JPEGs (train/ and val/, quality 90) a model learns in a few hundred
    steps: each class its own colour, with noise and a random bright square on top. Returns the count."""
    import numpy as np  # heavy enough: workers only
    from PIL import Image

    rng = np.random.default_rng(seed)
    n = 0
    for split, count in (("train", per_class), ("val", max(2, per_class // 10))):
        for c in range(classes):
            d = root / split / f"c{c:02d}"
            d.mkdir(parents=True, exist_ok=True)
            colour = np.array([(c * 97) % 256, (c * 57 + 80) % 256, (c * 151 + 40) % 256], dtype=np.float32)
            for i in range(count):
                img = colour + rng.normal(0, 40, (size, size, 3))
                y, x = rng.integers(0, size // 2, 2)
                img[y : y + size // 4, x : x + size // 4] = 255
                Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(d / f"{i:05d}.jpg", quality=90)
                n += 1
    return n


def w_jpeg_train(tiny: bool, out: Path) -> dict:
    """A training reading on real JPEGs: ViT-S/16 at 224² through `hpctrain train` for two short epochs,
    with DALI's `mixed` loader (nvJPEG on the GPU; `cpu` DALI on a CPU) and with the torch loader: the loss
    falls by LOSS_FALL, images/s and data wait of each, and their ratio. On a CPU (rehearsal): the tiny
    model on 48² JPEGs, the torch loader (and DALI's CPU pipeline where DALI is installed)."""
    import torch  # heavy: workers only

    cuda = torch.cuda.is_available()
    work = out / "jpeg"
    shutil.rmtree(work, ignore_errors=True)
    t0 = time.perf_counter()
    n = write_jpegs(work / "data", 10, 16 if tiny else 200, 48 if tiny else 256)
    write_s = time.perf_counter() - t0
    model = [] if tiny else [
        "model.arch=vit_small", "model.img_size=224", "model.patch_size=16", "model.depth=12",
        "model.width=384", "model.heads=6", "model.mlp_ratio=4",
    ]  # fmt: skip
    common = [
        f"data.root={work / 'data'}",
        "data.prepare=none",
        f"data.global_batch={16 if tiny else 128}",
        "data.workers=auto",
        f"run.dir={work / 'runs'}",
        "train.epochs=2",
        "optim.warmup_steps=3",
        "train.eval_every_epochs=0",
        "ckpt.every=0",
        "log.every=2",
        "log.trackers=[]",
        f"train.amp={'bf16' if cuda else 'none'}",
        *model,
    ]
    dali = importlib.util.find_spec("nvidia.dali") is not None
    loaders = ["torch", *(["dali"] if dali else [])]
    f: dict = {"images": n, "write_s": round(write_s, 1), "loss_fall": LOSS_FALL, "loaders": {}}
    problems = []
    for loader in loaders:
        name = f"jpeg-{loader}"
        c = [sys.executable, "-m", "hpctrain", "train", "--config", "digits_vit"]
        for s in (*common, f"data.loader={loader}", f"run.name={name}"):
            c += ["--set", s]
        r = subprocess.run(c, capture_output=True, text=True)
        print(f"===== {loader} (exit {r.returncode})\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
        if r.returncode:
            problems.append(f"{loader}: hpctrain train exits {r.returncode}")
            continue
        recs = [x for x in read_metrics(work / "runs" / name / "metrics.jsonl") if x.get("kind") == "train"]
        first, last = recs[0], recs[-1]
        row = {
            "first_loss": first["loss"],
            "final_loss": last["loss"],
            "images_per_s": last["images_per_s"],
            "data_wait": last["data_wait"],
            "steps": last["step"],
        }
        f["loaders"][loader] = row
        if not last["loss"] <= LOSS_FALL * first["loss"]:
            problems.append(f"{loader}: loss {first['loss']:.3f} → {last['loss']:.3f}, not below {LOSS_FALL:g}×")
    got = f["loaders"]
    if "dali" in got and "torch" in got:
        f["dali_over_torch"] = got["dali"]["images_per_s"] / got["torch"]["images_per_s"]
    each = "; ".join(
        f"{k} loss {v['first_loss']:.2f}→{v['final_loss']:.2f}, {v['images_per_s']:.0f} img/s, "
        f"data wait {v['data_wait']:.0%}"
        for k, v in got.items()
    )
    summary = f"{n} JPEGs in {write_s:.0f} s; {each}" + (
        f"; DALI/torch {f['dali_over_torch']:.2f}×" if "dali_over_torch" in f else ""
    )
    if cuda and not dali:
        problems.append("DALI not installed: no nvJPEG reading (pip install 'hpctrain[dali]')")
    return failed("; ".join(problems), summary, **f) if problems else passed(summary, **f)


def w_dali(tiny: bool, out: Path) -> dict:
    import torch  # heavy: workers only

    from hpctrain.config import load
    from hpctrain.data.build import build_loaders

    data = out / "jpeg" / "data"  # jpeg_train's JPEGs, else the same written here
    if not (data / "train").is_dir():
        data = out / "dali" / "data"
        shutil.rmtree(data, ignore_errors=True)
        write_jpegs(data, 10, 16 if tiny else 200, 48 if tiny else 256)
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    at224 = [] if tiny else ["model.img_size=224", "model.patch_size=16", "data.global_batch=128"]
    sets = [f"data.root={data}", "data.prepare=none", "data.loader=dali", "data.workers=auto", *at224]
    cfg = load("digits_vit", sets)
    t = time.perf_counter()
    train, _ = build_loaders(cfg, 0, 1, dev)
    build_s = time.perf_counter() - t
    train.set_epoch(0, 0)
    n = batches = 0
    first = None
    t = time.perf_counter()
    for images, labels in train:
        if first is None:
            first = {
                "images": [str(images.device), str(images.dtype), list(images.shape)],
                "labels": [str(labels.device), str(labels.dtype)],
                "label_range": [int(labels.min()), int(labels.max())],
            }
        n += images.shape[0]
        batches += 1
    if cuda:
        torch.cuda.synchronize()
    epoch_s = time.perf_counter() - t
    f = {
        "build_s": build_s,
        "epoch_s": epoch_s,
        "batches": batches,
        "len": len(train),
        "images": n,
        "images_per_s": n / epoch_s,
        "first_batch": first,
    }
    seen = (
        (
            f"batch {'×'.join(map(str, first['images'][2]))} {first['images'][1]} on {first['images'][0]}, "
            f"labels {first['labels'][1]}"
        )
        if first
        else "no batch"
    )
    summary = f"{n} images in {batches} batches, {n / epoch_s:.0f} img/s; {seen}"
    problems = []
    if batches != len(train):
        problems.append(f"{batches} batches, len() says {len(train)}")
    if first and not first["images"][0].startswith(dev.type):
        problems.append(f"images on {first['images'][0]}, not {dev}")
    if first and first["labels"][1] != "torch.int64":
        problems.append(f"labels {first['labels'][1]}")
    return failed("; ".join(problems), summary, **f) if problems else passed(summary, **f)


WORKERS = {
    "versions": w_versions,
    "numerics": w_numerics,
    "matmul": w_matmul,
    "attention": w_attention,
    "bench_eager": w_bench_eager,
    "bench_compiled": w_bench_compiled,
    "timm": w_timm,
    "fp16": w_fp16,
    "nccl": w_nccl,
    "train": w_train,
    "jpeg_train": w_jpeg_train,
    "dali": w_dali,
}


def work(a: argparse.Namespace) -> int:
    """One step in this process; its record goes to --result (the driver reads it)."""
    sys.path.insert(0, str(SRC))
    try:
        res = WORKERS[a.step](a.tiny, a.out)
    except Exception as e:  # noqa: BLE001 - any failure is the step's FAIL, with the traceback in its log
        traceback.print_exc()
        res = failed(f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}")
    res.setdefault("figures", {})
    Path(a.result).write_text(json.dumps(res, default=str))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="where gpu_accept.json, table.txt and logs/ go")
    ap.add_argument("--dry-run", action="store_true", help="list the steps and budgets; run nothing")
    ap.add_argument(
        "--only",
        type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
        default=None,
        help="comma-separated step names (default: all)",
    )
    ap.add_argument(
        "--budget-scale", type=float, default=1.0, help="multiply every budget (a slow or shared machine); default 1"
    )
    ap.add_argument(
        "--cpu-rehearsal",
        action="store_true",
        help="hide the GPUs from every step: what can run on a CPU runs at tiny sizes, the rest SKIPs",
    )
    ap.add_argument(
        "--stack",
        choices=STACKS,
        help="run the steps on this recipe's torch and DALI (a venv .ci/stack builds; PyPI the first time)",
    )
    ap.add_argument("--step", choices=list(WORKERS), help=argparse.SUPPRESS)  # a worker: one step
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    assert set(WORKERS) == set(BY_NAME)
    if a.dry_run:
        print(dry_run(a.budget_scale))
        return 0
    if a.out is None:
        ap.error("--out DIR is required (or --dry-run)")
    if a.only and set(a.only) - set(BY_NAME):
        ap.error(f"unknown step(s) {sorted(set(a.only) - set(BY_NAME))}; steps: {', '.join(BY_NAME)}")
    a.out = a.out.resolve()
    if a.step:
        return work(a)
    a.python = stack_python(a.stack) if a.stack else sys.executable
    return drive(a)


if __name__ == "__main__":
    sys.exit(main())

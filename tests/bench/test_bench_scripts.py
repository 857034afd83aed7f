"""bench/gpu.sh (syntax, --help, CPU smoke run) and bench/loop_overhead.py run and report."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GPU_SH = ROOT / "bench" / "gpu.sh"

# timm is not installed here (it is on the GPU machine); this stand-in has timm's create_model
# signature and builds hpctrain's ViT, whose modules and parameter names are timm's.
STAND_IN = '''
__version__ = "0-stand-in"


def create_model(name, pretrained=False, img_size=224, patch_size=16, embed_dim=768, depth=12,
                 num_heads=12, num_classes=1000):
    assert name == "vit_base_patch16_224" and not pretrained
    from hpctrain.models.vit import ViT
    return ViT(img_size=img_size, patch_size=patch_size, depth=depth, width=embed_dim,
               heads=num_heads, num_classes=num_classes)
'''


def test_gpu_sh_syntax_and_help():
    subprocess.run(["bash", "-n", str(GPU_SH)], check=True)
    r = subprocess.run(["bash", str(GPU_SH), "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    for word in ("--out", "--cpu-smoke", "--batches", "timm", "MFU"):
        assert word in r.stdout
    r = subprocess.run(["bash", str(GPU_SH)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--out DIR is required" in r.stderr
    r = subprocess.run(["bash", str(GPU_SH), "--out", "x", "--bogus"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and "unknown argument '--bogus'" in r.stderr


@pytest.mark.slow
def test_gpu_sh_cpu_smoke_run(tmp_path):
    fake = tmp_path / "site"
    (fake / "timm").mkdir(parents=True)
    (fake / "timm" / "__init__.py").write_text(STAND_IN)
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake), os.environ["PYTHONPATH"]]))
    # run from elsewhere: the script finds the repo (and its src/) from its own path
    r = subprocess.run(["bash", str(GPU_SH), "--out", str(out), "--batches", "8", "--steps", "1",
                        "--warmup", "0"], capture_output=True, text=True, timeout=300, env=env,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "no CUDA device visible" in r.stderr
    last = r.stdout.rstrip().splitlines()
    assert last[-6].startswith("bench/gpu.sh — CPU smoke")  # the table is printed last
    assert last[-1].startswith("hpctrain-eager-b8")
    rows = {row["case"]: row for row in csv.DictReader((out / "results.csv").read_text().splitlines())}
    assert set(rows) == {"hpctrain-compiled-b8", "timm-eager-b8", "hpctrain-eager-b8"}
    assert rows["hpctrain-compiled-b8"]["status"].startswith("skipped (cpu smoke")
    hp, tm = rows["hpctrain-eager-b8"], rows["timm-eager-b8"]
    assert hp["status"] == tm["status"] == "ok"
    assert float(hp["ratio_to_timm"]) == round(float(hp["images_per_s"]) / float(tm["images_per_s"]), 3)
    assert hp["sdpa_backend"] == tm["sdpa_backend"] == "flash (cpu)"
    env_rec = json.loads((out / "env.json").read_text())
    assert env_rec["cpu_smoke"] is True and env_rec["timm"] == "0-stand-in" and env_rec["gpu"] is None
    assert (out / "table.txt").read_text().strip() == "\n".join(last[-6:])


def test_gpu_bench_plan_without_timm():
    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "bench" / "gpu_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    plan = mod.cases([256, 512], smoke=False, have_timm=False)
    assert [c["case"] for c in plan] == [
        "hpctrain-compiled-b256", "timm-compiled-b256", "hpctrain-eager-b256",
        "hpctrain-compiled-b512", "timm-compiled-b512", "hpctrain-eager-b512"]
    assert [c.get("skip") for c in plan if c["impl"] == "timm"] == ["timm not installed"] * 2
    assert all("skip" not in c for c in plan if c["impl"] == "hpctrain")


@pytest.mark.slow
def test_loop_overhead_reports_a_ratio():
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "loop_overhead.py"), "--reps", "2", "--steps", "1",
                        "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["bare_ms"] > 0 and out["hpctrain_ms"] > 0 and out["ratio"] > 0
    assert out["ratio"] == out["hpctrain_ms"] / out["bare_ms"]


@pytest.mark.slow
def test_optim_step_reports_ratios_to_torch_adamw():
    """bench/optim_step.py, one short repetition: every hpctrain optimizer timed beside torch's
    AdamW(foreach=True) on ViT-S/16's 152 tensors, each ratio its median per-repetition ratio."""
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "optim_step.py"), "--reps", "1", "--steps", "1",
                        "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["tensors"] == 152 and 22e6 < out["values"] < 22.2e6
    assert {k for k in out if k.endswith("_ratio")} == {"adamw_low_mu_ratio", "lamb_ratio"}
    for name in ("adamw_low_mu", "lamb"):
        assert out[f"{name}_ratio"] == out[f"{name}_ms"] / out["torch_adamw_ms"]  # one repetition
        # foreach: a few dozen ATen calls per step, not ~13 per tensor (152 tensors) as the per-tensor loop made
        assert out[f"{name}_aten_calls"] < 400, out


@pytest.mark.slow
def test_host_costs_reports_ema_and_erase_before_and_after():
    """bench/host_costs.py, one short repetition without DALI: the EMA's cached lists and the batch's
    vectorised erase boxes each timed beside the way they were drawn before (issue 24 item 7)."""
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "host_costs.py"), "--reps", "1", "--batch", "64",
                        "--no-dali", "--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for k in ("ema", "ema_lists", "erase"):
        assert out[k]["before_ms"] > 0 and out[k]["after_ms"] > 0
        assert out[k]["ratio"] == out[k]["after_ms"] / out[k]["before_ms"]  # one repetition
    # (the ratios are the bench's figures, not a test's: one repetition on a loaded CI machine measured the
    # erase boxes at 0.50 where a quiet one gives 0.09; tests assert no timing)
    assert "dali_epoch" not in out

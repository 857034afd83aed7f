#!/usr/bin/env python3
"""timm's `vit_base_patch16_224` trained with its best flags, timed exactly like `hpctrain bench`.

bf16 autocast, `torch.compile`, fused AdamW, TF32, synthetic batches on the device; the timing,
FLOP count, MFU and memory come from `hpctrain.bench`, so the two sides differ only in the model
and the training step. Prints one JSON object; `bench/gpu_accept.py` calls `measure` (step 5).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(
    batch: int = 256,
    steps: int = 30,
    warmup: int = 5,
    compile: bool = True,
    tiny: bool = False,
    peak_tflops: float | None = None,
) -> dict:
    """One timm training step, timed; the record has the fields of `hpctrain bench --json` it shares."""
    import timm  # timm and torch: GPU machines only, and `--help` must answer without them
    import torch

    from hpctrain import flops
    from hpctrain.bench import compile_seconds, device_peak, figures, time_steps
    from hpctrain.train.fastpath import sdpa_backend_used

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    dims = dict(img_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12, num_classes=1000)
    if tiny:
        dims = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2, num_classes=10)
    torch.manual_seed(0)
    model = timm.create_model("vit_base_patch16_224", pretrained=False, **dims).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.05, fused=cuda or None)
    crit = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, dims["img_size"], dims["img_size"], generator=g).to(device)
    y = torch.randint(0, dims["num_classes"], (batch,), generator=g).to(device)
    amp = torch.autocast(device.type, dtype=torch.bfloat16)
    backend = sdpa_backend_used(model, x, amp)
    fwd = torch.compile(model) if compile else model

    def step(b):
        images, labels = b
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = crit(fwd(images), labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    timing = time_steps(step, lambda: (x, y), steps, warmup, device)
    macs = flops.vit_macs(
        dims["img_size"], dims["patch_size"], dims["depth"], dims["embed_dim"], 4.0, dims["num_classes"]
    )
    train_flops = flops.VitFlops(macs).train_flops
    name, peak, source = device_peak(device, peak_tflops)
    elapsed = timing["elapsed_s"]
    return {
        "impl": "timm",
        "timm": timm.__version__,
        "torch": torch.__version__,
        "device_name": name,
        "global_batch": batch,
        "compile": compile,
        "amp": "bf16",
        "fused_adamw": cuda,
        "sdpa_backend": backend,
        "steps": steps,
        "warmup_steps": warmup,
        "elapsed_s": elapsed,
        "step_time_ms": 1000 * elapsed / steps,
        **figures(batch * steps / elapsed, 1, train_flops, peak),
        "fwd_gmacs_per_image": macs / 1e9,
        "peak_tflops": peak,
        "peak_source": source,
        "peak_mem_mb": timing["peak_mem_mb"],
        "peak_mem_kind": timing["peak_mem_kind"],
        "host_syncs_per_step": timing["host_syncs_per_step"],
        "first_step_s": timing["first_step_s"],
        "compile_s": compile_seconds(timing["first_step_s"], elapsed / steps, compile),
        "loss": timing["loss"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--tiny", action="store_true", help="a 2-block 32² model (CPU smoke test)")
    ap.add_argument("--peak-tflops", type=float, default=None)
    args = ap.parse_args()
    print(json.dumps(measure(args.batch, args.steps, args.warmup, args.compile, args.tiny, args.peak_tflops)))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())

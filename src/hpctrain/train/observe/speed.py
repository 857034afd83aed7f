"""The speed and memory fields of each `train` record, and their part of the progress line.

Everything here is read when a record is written (every `log.every` steps), from values the
loop already has on the host or from counters that do not wait for the device: model FLOPs are
counted from the config (flops.py), MFU is against the dense-bf16 spec peak (or
`log.peak_tflops`), memory comes from gpustats. Fields that cannot be known are left out.
"""

from __future__ import annotations

from typing import Any

import torch

from hpctrain import flops
from hpctrain.train.observe import gpustats


def speed_fields(
    images_per_s: float, step_time_s: float, world: int, train_flops: float, peak_tflops: float | None
) -> dict[str, float]:
    """step_time_s, tflops (model TFLOP/s per device) and, with a peak, mfu and peak_tflops."""
    rec = {"step_time_s": step_time_s, "tflops": images_per_s * train_flops / max(world, 1) / 1e12}
    m = flops.mfu(images_per_s, train_flops, peak_tflops, world)
    if m is not None:
        rec.update(mfu=m, peak_tflops=peak_tflops)
    return rec


def progress_text(rec: dict[str, Any]) -> str:
    """The speed and memory part of the progress line: ' mfu 43.7% mem 61.2G 77% rss 3.1G'."""
    parts = []
    if "mfu" in rec:
        parts.append(f"mfu {100 * rec['mfu']:.1f}%")
    if "mem_reserved_gb" in rec:
        parts.append(f"mem {rec['mem_reserved_gb']:.1f}G {rec['mem_pct']:.0f}%")
    if rec.get("host_rss_gb") is not None:
        parts.append(f"rss {rec['host_rss_gb']:.1f}G")
    return "".join(" " + p for p in parts)


class SpeedMeter:
    """Per run: the FLOPs per image, the device's peak and (rank 0, CUDA) the NVML sampler."""

    def __init__(self, cfg, world: int, device):
        self.world, self.device = world, device
        self.train_flops = flops.model_flops(cfg.model).train_flops
        self.peak: float | None = cfg.log.peak_tflops or None
        if self.peak is None and device.type == "cuda":
            self.peak = flops.peak_tflops(torch.cuda.get_device_name(device))[0]
        self.nvml: gpustats.NvmlSampler | None = None

    def open(self, sample_gpus: bool) -> None:
        """Start the NVML sampler (on CUDA only: a CPU run never loads NVML)."""
        if sample_gpus and self.device.type == "cuda" and self.nvml is None:
            self.nvml = gpustats.NvmlSampler.start()

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.stop()
            self.nvml = None

    def fields(self, images_per_s: float, step_time_s: float) -> dict[str, Any]:
        rec: dict[str, Any] = speed_fields(images_per_s, step_time_s, self.world, self.train_flops, self.peak)
        rec.update(gpustats.cuda_memory(self.device))
        rss = gpustats.host_rss_gb()
        if rss is not None:
            rec["host_rss_gb"] = rss
        gpus = self.nvml.take() if self.nvml else None
        if gpus:
            rec["gpus"] = gpus
        return rec

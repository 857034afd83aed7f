"""Memory and GPU readings for the `train` records, none of which waits for the device.

CUDA memory comes from the caching allocator's counters (host-side bookkeeping, no sync); host
RSS from /proc; per-GPU utilisation, memory, power and SM clock from NVML (`pynvml`, package
nvidia-ml-py), polled by a daemon thread so the training thread never calls into the driver for
them — the habit of watching `nvidia-smi`, without a process per step. Where a reading cannot be
taken (no CUDA, no NVML, not Linux) it is absent, never zero: a zero would read as a measurement.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import torch

log = logging.getLogger("hpctrain")
GIB = float(1 << 30)


def host_rss_gb() -> float | None:
    """Resident memory of this process now (GiB), from /proc/self/statm; None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / GIB


def cuda_memory(device) -> dict[str, float]:
    """{mem_alloc_gb, mem_reserved_gb, mem_pct}: the allocator's peaks since the last call (the
    peaks are reset here, so each record covers its own window); {} off CUDA."""
    if getattr(device, "type", None) != "cuda":
        return {}
    alloc = torch.cuda.max_memory_allocated(device)
    reserved = torch.cuda.max_memory_reserved(device)
    torch.cuda.reset_peak_memory_stats(device)
    total = torch.cuda.get_device_properties(device).total_memory
    return {"mem_alloc_gb": alloc / GIB, "mem_reserved_gb": reserved / GIB,
            "mem_pct": 100.0 * reserved / max(total, 1)}


class NvmlSampler:
    """Polls every GPU NVML sees on this node every `interval_s` in a daemon thread; `take()`
    returns the means since the last call (memory: the largest), one dict per GPU.

    NVML numbers GPUs in PCI bus order, which is CUDA's order only with
    CUDA_DEVICE_ORDER=PCI_BUS_ID; the `index` in the records is NVML's.
    """

    FIELDS = ("util_pct", "mem_used_gb", "power_w", "sm_clock_mhz")
    _said = False  # the reason for no readings is logged once per process

    def __init__(self, nvml, handles: list, interval_s: float):
        self._nvml, self._handles, self.interval_s = nvml, handles, interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sums: list[dict[str, float]] = [{} for _ in handles]
        self._count = 0
        self._last: list[dict[str, Any]] | None = None
        self._thread = threading.Thread(target=self._loop, name="hpctrain-nvml", daemon=True)

    @classmethod
    def start(cls, interval_s: float = 1.0) -> NvmlSampler | None:
        """A running sampler, or None when NVML is not there (no package, no driver, no GPU):
        said once at debug level, since a CPU run expects nothing else."""
        try:
            import pynvml  # pynvml: optional (nvidia-ml-py), NVIDIA GPUs only

            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception as e:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, driver errors
            if not NvmlSampler._said:
                log.debug("no NVML GPU readings: %s", e)
                NvmlSampler._said = True
            return None
        if not handles:
            pynvml.nvmlShutdown()
            return None
        sampler = cls(pynvml, handles, interval_s)
        sampler._thread.start()
        return sampler

    def _read(self, h) -> dict[str, float]:
        n = self._nvml
        return {"util_pct": float(n.nvmlDeviceGetUtilizationRates(h).gpu),
                "mem_used_gb": n.nvmlDeviceGetMemoryInfo(h).used / GIB,
                "power_w": n.nvmlDeviceGetPowerUsage(h) / 1000.0,  # NVML reports milliwatts
                "sm_clock_mhz": float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM))}

    def sample(self) -> None:
        """One reading of every GPU, added to the window (the thread calls this)."""
        try:
            rows = [self._read(h) for h in self._handles]
        except Exception as e:  # noqa: BLE001 - a GPU that stops answering must not end the run
            log.debug("NVML reading failed: %s", e)
            return
        with self._lock:
            for acc, row in zip(self._sums, rows):
                for k, v in row.items():
                    acc[k] = max(acc.get(k, 0.0), v) if k == "mem_used_gb" else acc.get(k, 0.0) + v
            self._count += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def take(self) -> list[dict[str, Any]] | None:
        """Per GPU {index, util_pct, mem_used_gb, power_w, sm_clock_mhz} over the window since the
        last call (the previous window's when no reading came in since); None before any."""
        with self._lock:
            sums, count = self._sums, self._count
            self._sums, self._count = [{} for _ in self._handles], 0
        if count:
            self._last = [{"index": i, **{k: (v if k == "mem_used_gb" else v / count) for k, v in acc.items()}}
                          for i, acc in enumerate(sums)]
        return self._last

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5 * self.interval_s + 1)
        try:
            self._nvml.nvmlShutdown()
        except Exception as e:  # noqa: BLE001
            log.debug("nvmlShutdown: %s", e)

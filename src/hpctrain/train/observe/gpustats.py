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
    return {"mem_alloc_gb": alloc / GIB, "mem_reserved_gb": reserved / GIB, "mem_pct": 100.0 * reserved / max(total, 1)}


class NvmlSampler:
    """Polls every GPU NVML can open on this node every `interval_s` in a daemon thread; `take()`
    returns the means since the last call (memory: the largest), one dict per GPU.

    Each GPU stands alone: one NVML may not open (NVML_ERROR_NO_PERMISSION for a GPU outside the
    task's Slurm device cgroup: nvmlDeviceGetCount_v2 counts every GPU of the node, the handle of
    one the process may not touch is refused) or one that stops answering leaves out that GPU's
    fields, never the others'; which were left out, and why, is said once (INFO when it cannot be
    opened, WARNING when it stops answering). Each field stands alone too: one NVML does not support
    on a GPU (NVMLError_NotSupported) is left out of its row, the others kept (said once, INFO).

    NVML numbers GPUs in PCI bus order, which is CUDA's order only with
    CUDA_DEVICE_ORDER=PCI_BUS_ID; the `index` in the records is NVML's.
    """

    FIELDS = ("util_pct", "mem_used_gb", "power_w", "sm_clock_mhz")
    _said = False  # the reason for no readings is logged once per process

    def __init__(self, nvml, handles: list, interval_s: float, indices: list[int] | None = None):
        self._nvml, self._handles, self.interval_s = nvml, handles, interval_s
        self.indices = list(range(len(handles))) if indices is None else list(indices)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sums: list[dict[str, float]] = [{} for _ in handles]
        self._counts: list[dict[str, int]] = [{} for _ in handles]  # readings per field
        self._last: list[dict[str, Any] | None] = [None] * len(handles)
        self._failed: set[int] = set()  # GPUs whose failed reading was logged (once each)
        self._failed_fields: set[tuple[int, str]] = set()  # (GPU, field) whose failure was logged
        self._getters = self.getters(nvml)  # built once: the thread reads every GPU each interval
        self._thread = threading.Thread(target=self._loop, name="hpctrain-nvml", daemon=True)

    @classmethod
    def start(cls, interval_s: float = 1.0) -> NvmlSampler | None:
        """A running sampler over the GPUs NVML opens, or None when it opens none. No NVML at all
        (no package, no driver) is said once at debug level, since a CPU run expects nothing else;
        GPUs NVML counts but cannot open are named once at INFO."""
        try:
            import pynvml  # pynvml: optional (nvidia-ml-py), NVIDIA GPUs only

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except Exception as e:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, driver errors
            if not NvmlSampler._said:
                log.debug("no NVML GPU readings: %s", e)
                NvmlSampler._said = True
            return None
        handles, indices, skipped = [], [], []
        for i in range(count):
            try:
                handles.append(pynvml.nvmlDeviceGetHandleByIndex(i))
                indices.append(i)
            except Exception as e:  # noqa: BLE001 - NVMLError_NoPermission (device cgroup), a GPU lost
                skipped.append(f"{i} ({e})")
        if skipped:
            log.info(
                "NVML readings: GPU %s skipped (NVML cannot open %s; normal for GPUs outside this "
                "job's device cgroup): their util/memory/power/clock fields are absent; read: %s",
                ", ".join(skipped),
                "it" if len(skipped) == 1 else "them",
                ", ".join(map(str, indices)) or "none",
            )
        if not handles:
            pynvml.nvmlShutdown()
            return None
        sampler = cls(pynvml, handles, interval_s, indices)
        sampler._thread.start()
        return sampler

    @staticmethod
    def getters(n) -> dict[str, Any]:
        """Per field, how it is read from a GPU's handle by NVML module `n`."""
        return {
            "util_pct": lambda h: float(n.nvmlDeviceGetUtilizationRates(h).gpu),
            "mem_used_gb": lambda h: n.nvmlDeviceGetMemoryInfo(h).used / GIB,
            "power_w": lambda h: n.nvmlDeviceGetPowerUsage(h) / 1000.0,  # NVML reports milliwatts
            "sm_clock_mhz": lambda h: float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
        }

    def _read(self, pos: int, h) -> dict[str, float] | None:
        """One GPU's fields, each read on its own: one that NVML does not support on this GPU
        (NVMLError_NotSupported: power on some boards) or that fails is left out, the others kept
        (said once per GPU and field). None when no field reads: the GPU has stopped answering."""
        row: dict[str, float] = {}
        errors: dict[str, Exception] = {}
        for field, get in self._getters.items():
            try:
                row[field] = get(h)
            except Exception as err:  # noqa: BLE001 - NVMLError_NotSupported, a GPU that stops answering
                errors[field] = err
        if not row:
            if pos not in self._failed:
                self._failed.add(pos)
                log.warning(
                    "NVML reading of GPU %d failed (%s): its fields are absent while it fails; "
                    "the other GPUs are still read",
                    self.indices[pos],
                    next(iter(errors.values())),
                )
            return None
        not_supported = getattr(self._nvml, "NVMLError_NotSupported", ())
        for field, error in errors.items():
            if (pos, field) in self._failed_fields:
                continue
            self._failed_fields.add((pos, field))
            if isinstance(error, not_supported):
                log.info("NVML: GPU %d does not report %s (%s): that field is absent", self.indices[pos], field, error)
            else:
                log.warning(
                    "NVML: reading %s of GPU %d failed (%s): that field is absent while it fails; "
                    "the GPU's other fields are still read",
                    field,
                    self.indices[pos],
                    error,
                )
        return row

    def sample(self) -> None:
        """One reading of every GPU, added to the window (the thread calls this); a field or a GPU
        whose reading fails is left out of this one (said once), the others are kept."""
        rows = [self._read(pos, h) for pos, h in enumerate(self._handles)]
        with self._lock:
            for pos, row in enumerate(rows):
                if row is None:
                    continue
                acc, counts = self._sums[pos], self._counts[pos]
                for k, v in row.items():
                    acc[k] = max(acc.get(k, 0.0), v) if k == "mem_used_gb" else acc.get(k, 0.0) + v
                    counts[k] = counts.get(k, 0) + 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def take(self) -> list[dict[str, Any]] | None:
        """Per GPU {index, util_pct, mem_used_gb, power_w, sm_clock_mhz} over the window since the
        last call (a GPU with no reading since: its previous window's, or nothing before its first);
        None before any reading."""
        with self._lock:
            sums, counts = self._sums, self._counts
            self._sums, self._counts = [{} for _ in self._handles], [{} for _ in self._handles]
        for pos, (acc, count) in enumerate(zip(sums, counts)):
            if acc:
                self._last[pos] = {
                    "index": self.indices[pos],
                    **{k: (v if k == "mem_used_gb" else v / count[k]) for k, v in acc.items()},
                }
        out = [row for row in self._last if row is not None]
        return out or None

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5 * self.interval_s + 1)
        try:
            self._nvml.nvmlShutdown()
        except Exception as e:  # noqa: BLE001
            log.debug("nvmlShutdown: %s", e)

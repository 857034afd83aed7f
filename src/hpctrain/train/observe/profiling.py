"""Where a step's time goes: a torch.profiler window over global steps A-B (log.profile_steps), CUDA
allocator snapshots (log.memory_snapshot_steps) and cudaProfilerStart/Stop around the same steps
for `hpctrain submit --nsys-ranks` (nsys --capture-range=cudaProfilerApi; launch.container).

Off by default and free when off: `open_window` returns None before anything is imported or built,
and the loop's only cost is an `if` per step. Steps are global step numbers (the step a checkpoint
records): a resumed attempt schedules the window relative to the step it resumed at, so the same
steps are profiled whether or not the job was requeued in between (docs/profiling.md).
"""

from __future__ import annotations

import gzip
import logging
import os
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from hpctrain.config import LogConfig, step_window

log = logging.getLogger("hpctrain")

NSYS_ENV = "HPCTRAIN_NSYS"  # set to 1 by the nsys wrapper of the task (launch.container.nsys_wrapper)
# collectives by name: NCCL kernels (ncclDevKernel_*), gloo/c10d ops (gloo:all_reduce, c10d::allreduce_)
COMM_MARKERS = ("nccl", "gloo", "c10d", "allreduce", "all_reduce", "reduce_scatter", "allgather", "all_gather")
TOP_OPS = 10


def profile_ranks(cfg: LogConfig, world_size: int) -> set[int]:
    """log.profile_ranks, or rank 0 and the last rank."""
    return set(cfg.profile_ranks) if cfg.profile_ranks else {0, world_size - 1}


def plan_schedule(window: tuple[int, int], start_step: int) -> tuple[int, int, int, int] | None:
    """(wait, warmup, active, first profiled step) of a torch.profiler.schedule whose step 0 is global
    step `start_step + 1`; None when the window ended before `start_step + 1`. A window the resume
    cut into starts at the first step still ahead (no warmup then)."""
    a, b = window
    first = max(a, start_step + 1)
    if first > b:
        return None
    lead = first - (start_step + 1)
    warmup = 1 if lead >= 1 else 0
    return lead - warmup, warmup, b - first + 1, first


def make_profiler(cfg: LogConfig, device: torch.device, sched: Callable, on_ready: Callable):
    """The torch.profiler.profile of a window (the one place a profiler is built)."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(
        activities=acts, schedule=sched, on_trace_ready=on_ready, record_shapes=True, with_stack=cfg.profile_with_stack
    )


def union_s(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merged, sorted intervals."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def exposed(comm: list[tuple[float, float]], compute: list[tuple[float, float]]) -> float:
    """Length of the union of `comm` not covered by the union of `compute` (same time unit)."""
    total, cover = 0.0, union_s(compute)
    for s, e in union_s(comm):
        covered = sum(max(0.0, min(e, ce) - max(s, cs)) for cs, ce in cover)
        total += (e - s) - covered
    return total


def is_comm(name: str) -> bool:
    n = name.lower()
    return any(m in n for m in COMM_MARKERS)


def device_time(avg) -> float:
    """An op's self device time in µs (`self_device_time_total` from torch 2.4, `self_cuda_time_total` before)."""
    return float(getattr(avg, "self_device_time_total", getattr(avg, "self_cuda_time_total", 0.0)) or 0.0)


def top_table(avgs, key: Callable, title: str) -> list[str]:
    rows = sorted((a for a in avgs if key(a) > 0), key=key, reverse=True)[:TOP_OPS]
    total = sum(key(a) for a in avgs) or 1.0
    lines = [f"  top ops by {title} (of {total / 1e3:.1f} ms):"]
    for a in rows:
        name = a.key if len(a.key) <= 48 else a.key[:45] + "..."
        lines.append(f"    {name:<48} {key(a) / 1e3:9.2f} ms {100 * key(a) / total:5.1f}%  {a.count:6d} calls")
    return lines


class Window:
    """The step hooks of one rank: `before(step)` ahead of global step `step` (its data fetch
    included), `after(step, data_wait_s)` once it ended, `close()` at the end of the attempt."""

    def __init__(
        self, cfg: LogConfig, rank: int, world_size: int, run_dir: Path, device: torch.device, start_step: int
    ):
        self.rank, self.device, self.out = rank, device, run_dir / "profile"
        self.prof_window = step_window(cfg.profile_steps, "log.profile_steps")
        self.mem_window = step_window(cfg.memory_snapshot_steps, "log.memory_snapshot_steps")
        chosen = rank in profile_ranks(cfg, world_size)
        self.cuda = device.type == "cuda"
        plan = plan_schedule(self.prof_window, start_step) if self.prof_window else None
        # every rank on CUDA: cudaProfilerStart/Stop around the window (a no-op where nsys does not run)
        self.nsys = (plan[3], self.prof_window[1]) if self.cuda and plan else None
        self.prof = None
        self.first = 0
        self.steps: list[tuple[float, float]] = []  # (wall s, data wait s) of the profiled steps
        self.t0 = 0.0
        if self.mem_window and chosen and not self.cuda:
            log.info(
                "log.memory_snapshot_steps=%s: allocator snapshots are CUDA-only; this rank trains on %s, no snapshot",
                cfg.memory_snapshot_steps,
                device.type,
            )
        self.mem_window = self.mem_window if chosen and self.cuda else None
        if not (self.prof_window and chosen):
            return
        if os.environ.get(NSYS_ENV) == "1" and self.cuda:
            log.info(
                "log.profile_steps: this rank runs under nsys (--nsys-ranks), which owns CUPTI: "
                "no torch.profiler trace here"
            )
            return
        if plan is None:
            log.info(
                "log.profile_steps=%s ended before step %d where this attempt starts: no profile",
                cfg.profile_steps,
                start_step + 1,
            )
            return
        wait, warmup, active, self.first = plan
        if self.first != self.prof_window[0]:
            log.info(
                "log.profile_steps=%s: this attempt starts at step %d, profiling steps %d-%d",
                cfg.profile_steps,
                start_step + 1,
                self.first,
                self.prof_window[1],
            )
        with warnings.catch_warnings():  # warmup=0 (a window right at the start) warns; said above
            warnings.simplefilter("ignore")
            sched = torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1)
        self.prof = make_profiler(cfg, device, sched, self._ready)
        self.prof.start()

    def before(self, step: int) -> None:
        if self.nsys and step == self.nsys[0]:
            torch.cuda.profiler.start()  # cudaProfilerStart: nsys --capture-range=cudaProfilerApi begins
        if self.mem_window and step == self.mem_window[0]:
            torch.cuda.memory._record_memory_history(max_entries=200_000)
        self.t0 = time.perf_counter()

    def after(self, step: int, wait_s: float) -> None:
        if self.prof is not None:
            if self.first <= step <= self.prof_window[1]:
                self.steps.append((time.perf_counter() - self.t0, wait_s))
            self.prof.step()
        if self.nsys and step == self.nsys[1]:
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()  # cudaProfilerStop: nsys writes its report
        if self.mem_window and step == self.mem_window[1]:
            self.out.mkdir(parents=True, exist_ok=True)
            path = self.out / f"memory-rank-{self.rank}-step-{self.mem_window[0]}.pickle"
            torch.cuda.memory._dump_snapshot(str(path))
            torch.cuda.memory._record_memory_history(enabled=None)
            log.info(
                "memory snapshot of steps %d-%d: %s (drag it into https://pytorch.org/memory_viz)",
                *self.mem_window,
                path,
            )
            self.mem_window = None

    def close(self) -> None:
        """End a window the attempt stopped inside (its partial trace is written)."""
        if self.prof is not None:
            prof, self.prof = self.prof, None
            prof.stop()

    # ------------------------------------------------------------------ trace and summary

    def _ready(self, prof) -> None:
        """on_trace_ready: the trace file, then the summary in this rank's log."""
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / f"rank-{self.rank}-step-{self.first}.pt.trace.json.gz"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.json")
        prof.export_chrome_trace(str(tmp))  # plain JSON on every torch; gzip here (TensorBoard/Perfetto read it)
        with open(tmp, "rb") as fin, gzip.open(path, "wb") as fout:
            shutil.copyfileobj(fin, fout)
        tmp.unlink()
        log.info("%s", "\n".join(self.summary(prof, path)))

    def summary(self, prof, path: Path) -> list[str]:
        """One screen: steps, data wait, communication, top ops by self CPU (and CUDA) time."""
        n = len(self.steps)
        last = self.first + n - 1
        wall = sum(s for s, _ in self.steps)
        wait = sum(w for _, w in self.steps)
        lines = [
            f"profile of steps {self.first}-{last} on rank {self.rank}: {path}",
            f"  {n} steps, {1e3 * wall / max(n, 1):.1f} ms/step; data wait {1e3 * wait / max(n, 1):.1f} "
            f"ms/step ({100 * wait / max(wall, 1e-9):.1f}% of the step)",
        ]
        avgs = prof.key_averages()
        comm_cpu = sum(a.self_cpu_time_total for a in avgs if is_comm(a.key))
        lines.append("  " + self.comm_line(prof, comm_cpu, wall, n))
        lines += top_table(avgs, lambda a: float(a.self_cpu_time_total), "self CPU time")
        if self.cuda:
            lines += top_table(avgs, device_time, "self CUDA time")
        return lines

    def comm_line(self, prof, comm_cpu_us: float, wall_s: float, n: int) -> str:
        """Exposed communication: on CUDA, the time communication kernels (NCCL) run while no compute
        kernel runs, from the kernels' own timestamps; on CPU not measurable (gloo runs collectives on
        its own threads and the wait for them is no profiler op): the collectives' issuing CPU time."""
        if not self.cuda:
            return (
                f"exposed communication: not measured on CPU (gloo works on its own threads); collective "
                f"ops' self CPU time {comm_cpu_us / 1e3 / max(n, 1):.2f} ms/step"
            )
        comm, compute = [], []
        for e in prof.events():
            if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
                continue
            span = (float(e.time_range.start), float(e.time_range.end))
            (comm if is_comm(e.name) else compute).append(span)
        busy = sum(e - s for s, e in union_s(comm))
        ex = exposed(comm, compute)
        return (
            f"communication kernels {busy / 1e3 / max(n, 1):.2f} ms/step, exposed (no compute kernel running) "
            f"{ex / 1e3 / max(n, 1):.2f} ms/step = {100 * ex / 1e6 / max(wall_s, 1e-9):.1f}% of the step"
        )


def open_window(
    cfg: LogConfig, rank: int, world_size: int, run_dir: Path | None, device: torch.device, start_step: int
) -> Window | None:
    """The rank's Window, or None (nothing built) when neither window is set or there is no run dir."""
    if run_dir is None or not (cfg.profile_steps.strip() or cfg.memory_snapshot_steps.strip()):
        return None
    return Window(cfg, rank, world_size, run_dir, device, start_step)

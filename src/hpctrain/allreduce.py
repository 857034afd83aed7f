"""All-reduce bus bandwidth over a process group, the way nccl-tests reports it.

busbw = algbw × 2(n−1)/n for n ranks: the per-link traffic of a ring all-reduce, comparable to
the fabric's line rate (e.g. ~24 GB/s for one 200 Gb/s HDR port) whatever the rank count.
Runs over the job's ranks (torchrun or srun), or spawns `procs` local ones.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import socket
import time

from hpctrain.train import dist

UNITS = {
    "": 1,
    "B": 1,
    "K": 1024,
    "KB": 1024,
    "KIB": 1024,
    "M": 1024**2,
    "MB": 1024**2,
    "MIB": 1024**2,
    "G": 1024**3,
    "GB": 1024**3,
    "GIB": 1024**3,
}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in UNITS:
        raise ValueError(f"bad size {text!r}: use bytes with an optional K/M/G suffix, e.g. 64K, 16M")
    return int(float(m.group(1)) * UNITS[m.group(2).upper()])


def human(n: int) -> str:
    for unit, f in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if n >= f and n % f == 0:
            return f"{n // f}{unit}"
    return f"{n}B"


def measure(sizes: list[int], iters: int, warmup: int, device) -> list[dict]:
    """In an initialised process group: time `iters` all-reduces per size (slowest rank counts)."""
    import torch  # torch: a top-level module imports light (login node)
    import torch.distributed as td

    world = td.get_world_size()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    check = torch.ones(4, device=device)
    td.all_reduce(check)
    if not torch.all(check == world):
        raise RuntimeError(f"all-reduce gave {check.tolist()}, expected {world} everywhere")
    rows = []
    for nbytes in sizes:
        t = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)
        for _ in range(warmup):
            td.all_reduce(t)
        sync()
        td.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            td.all_reduce(t)
        sync()
        dt = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
        td.all_reduce(dt, op=td.ReduceOp.MAX)
        sec = float(dt.item())
        algbw = t.numel() * 4 / sec / 1e9
        rows.append(
            {
                "bytes": t.numel() * 4,
                "ranks": world,
                "time_us": sec * 1e6,
                "algbw_GBps": algbw,
                "busbw_GBps": algbw * 2 * (world - 1) / world,
            }
        )
    return rows


def format_rows(rows: list[dict]) -> str:
    head = f"all-reduce over {rows[0]['ranks']} ranks (float32 sum)" if rows else "all-reduce: no sizes"
    lines = [head, f"  {'size':>8}  {'time (us)':>12}  {'algbw (GB/s)':>12}  {'busbw (GB/s)':>12}"]
    for r in rows:
        lines.append(
            f"  {human(r['bytes']):>8}  {r['time_us']:>12.1f}  {r['algbw_GBps']:>12.3f}  {r['busbw_GBps']:>12.3f}"
        )
    return "\n".join(lines)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, backend: str, sizes, iters, warmup, queue) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from hpctrain.train import collective  # torch: a top-level module imports light (login node)

    info = dist.DistInfo(rank, world, rank, "127.0.0.1", port, "local")
    collective.init(info, backend, timeout_s=300)
    try:
        rows = measure(sizes, iters, warmup, _device(backend, rank))
        if rank == 0:
            queue.put(rows)
    finally:
        collective.shutdown()


def _device(backend: str, local_rank: int):
    import torch  # torch: a top-level module imports light (login node)

    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def default_backend() -> str:
    import torch  # torch: a top-level module imports light (login node)

    return "nccl" if torch.cuda.is_available() else "gloo"


def run_local(
    procs: int,
    sizes: list[int],
    iters: int = 10,
    warmup: int = 2,
    backend: str | None = None,
    timeout_s: float = 600,
) -> list[dict]:
    """Spawn `procs` ranks on this machine (loopback rendezvous) and return rank 0's rows."""
    backend = backend or default_backend()
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = _free_port()
    ps = [
        ctx.Process(target=_worker, args=(r, procs, port, backend, sizes, iters, warmup, queue)) for r in range(procs)
    ]
    for p in ps:
        p.start()
    deadline = time.monotonic() + timeout_s
    for p in ps:
        p.join(max(1.0, deadline - time.monotonic()))
    for p in ps:
        if p.is_alive():
            p.kill()
    bad = [(r, p.exitcode) for r, p in enumerate(ps) if p.exitcode != 0]
    if bad:
        raise RuntimeError(f"all-reduce ranks failed (rank, exit code): {bad}")
    return queue.get()


def run_in_job(sizes: list[int], iters: int = 10, warmup: int = 2, backend: str | None = None) -> list[dict] | None:
    """Inside torchrun/srun: join the job's process group; rank 0 gets the rows, others None."""
    from hpctrain.train import collective  # torch: a top-level module imports light (login node)

    info = dist.detect()
    backend = backend or default_backend()
    collective.init(info, backend, timeout_s=300)
    try:
        rows = measure(sizes, iters, warmup, _device(backend, info.local_rank))
    finally:
        collective.shutdown()
    return rows if info.is_main else None

"""Preflight (`health.preflight`): before training, on every start, check each node and keep bad ones out.

A node with a slow GPU, a degraded link or a broken decoder holds every synchronous step of the job
up, for its whole length. So before the first step every rank times a matmul, every node pair times
an all-reduce and every rank decodes a few of the run's own images with DALI. A node that fails is
named through `hpctrain.run.badnodes` (rank 0, after the results are gathered) and every rank fails the
step with one line naming it: the batch shell starts the next step without it (hot spares) or adds
it to the job's ExcNodeList before requeueing (docs/preflight.md).

Each figure is judged against a reference where one is known (GPU: its dense bf16 peak,
`hpctrain.flops`; a node pair: the fabric's all-reduce busbw, `hpctrain.plan.tables`), else against
the median rank or pair (CPU, or a GPU/fabric without a figure). A node is named only when others
pass the same check: when every rank or every pair falls short, the reference, the data or the
fabric as a whole is at fault, and the step fails naming no node.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as td

from hpctrain import flops
from hpctrain.data.build import resolve_loader
from hpctrain.errors import LaunchError
from hpctrain.plan import tables
from hpctrain.run import badnodes
from hpctrain.run.layout import METRICS
from hpctrain.run.metrics import MetricsWriter
from hpctrain.site import gpudirect
from hpctrain.train.health import straggler

log = logging.getLogger("hpctrain")
FABRIC_ENV = "HPCTRAIN_FABRIC"  # the profile's fabric.kind, exported by the batch shell
DECODE_IMAGES = 8  # the same first images of the train split on every rank: a bad file fails everywhere


class PreflightFailed(LaunchError):
    """The preflight found nodes (or the job as a whole) unfit to train; the message names them."""


@dataclass(frozen=True)
class Sizes:
    """How much each check measures: large on GPUs (~30 s in all), small on CPUs (a few seconds)."""

    matmul_n: int  # square matmul side
    matmul_s: float  # seconds of timed matmuls per rank (long enough for clocks to settle under load)
    rep_s: float  # one timed repetition; the rate is taken at the median (GPU) or fastest (CPU) one
    allreduce_bytes: int  # float32 message per all-reduce (large: busbw, not latency)
    allreduce_iters: int
    warmup: int


GPU = Sizes(matmul_n=8192, matmul_s=10.0, rep_s=0.2, allreduce_bytes=256 << 20, allreduce_iters=20, warmup=3)
# Repetitions well above the scheduler's time slice: ranks sharing cores share them evenly per repetition.
CPU = Sizes(matmul_n=256, matmul_s=0.6, rep_s=0.06, allreduce_bytes=1 << 20, allreduce_iters=10, warmup=2)


# ----------------------------------------------------------------------------- pure decisions


def pair_rounds(nodes: Sequence[str]) -> list[list[tuple[str, str]]]:
    """Rounds of disjoint node pairs, run one round at a time: (0,1),(2,3),… then the shifted pairing
    (1,2),(3,4),…,(N-1,0); with N odd, each of those leaves one node out, and a third round pairs the
    two left out. So with N ≥ 3 every node is in two pairs with different partners, and a slow pair
    can be put down to the node whose other pair is slow too. N = 2: one pair; N = 1: none."""
    n = len(nodes)
    first = [(nodes[i], nodes[i + 1]) for i in range(0, n - 1, 2)]
    shifted = [(nodes[i], nodes[(i + 1) % n]) for i in range(1, n, 2)]
    rounds, seen = [], set()
    for pairing in (first, shifted, [(nodes[n - 1], nodes[0])] if n % 2 and n > 1 else []):
        fresh = [p for p in pairing if frozenset(p) not in seen and p[0] != p[1]]
        seen.update(frozenset(p) for p in fresh)
        if fresh:
            rounds.append(fresh)
    return rounds


def below(values: Sequence[float], floor: float | None, tolerance: float) -> list[int]:
    """Indices of the values that fail: under `floor` when a reference is known, else more than
    `tolerance` (a fraction) below the median."""
    if floor is None:
        floor = (1.0 - tolerance) * statistics.median(values) if values else 0.0
    return [i for i, v in enumerate(values) if v < floor]


def _short(v: float, ref: float | None, median: float, tolerance: float, ref_text: str, unit: str) -> str:
    """Why `v` failed: under the reference, or how far under the median."""
    if ref is not None:
        return f"{v:.3g} {unit}, under {ref_text}"
    return (
        f"{v:.3g} {unit}, {100 * (1 - v / median):.0f} % below the median's {median:.3g} "
        f"(tolerance {100 * tolerance:.0f} %)"
    )


def blame_pairs(pairs: Sequence[tuple[str, str]], slow: set[int]) -> tuple[dict[str, list[int]], list[int]]:
    """({node: its slow pairs} for each node whose every pair is slow, slow pairs put down to neither
    node) — a slow pair between two nodes that each have a fast pair is the link's, or the switch's."""
    of_node: dict[str, list[int]] = {}
    for i, (a, b) in enumerate(pairs):
        of_node.setdefault(a, []).append(i)
        of_node.setdefault(b, []).append(i)
    bad = {n: idx for n, idx in of_node.items() if idx and all(i in slow for i in idx)}
    blamed = {i for idx in bad.values() for i in idx}
    return bad, sorted(slow - blamed)


@dataclass
class Verdict:
    """What the preflight found: failing nodes with why, or a failure that names no node."""

    bad: dict[str, str] = field(default_factory=dict)  # node → reasons
    shared: list[str] = field(default_factory=list)  # failures of every rank / pair: no node to blame
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.bad and not self.shared

    def add(self, node: str, why: str) -> None:
        self.bad[node] = f"{self.bad[node]}; {why}" if node in self.bad else why


def judge(
    nodes_of_rank: Sequence[str],
    gpu_of_rank: Sequence[int],
    tflops: Sequence[float | None],
    pairs: Sequence[tuple[str, str]],
    busbw: Sequence[float],
    decode: Sequence[dict | None],
    *,
    peak: float | None,
    peak_source: str,
    fabric_gbps: float | None,
    fabric_source: str,
    min_frac: float,
    tolerance: float,
    errors: Sequence[str | None] = (),
) -> Verdict:
    """The verdict from every rank's figures (the same inputs give the same verdict on every rank).
    `errors[r]`: why rank r's matmul raised (its `tflops[r]` is None then)."""
    v = Verdict()
    errors = list(errors) or [None] * len(tflops)
    failed = [r for r, e in enumerate(errors) if e]
    if failed and len(failed) == len(errors):
        v.shared.append(f"the matmul fails on every rank: {errors[0]}")
    for r in failed if len(failed) < len(errors) else ():
        v.add(nodes_of_rank[r], f"matmul failed on rank {r} (GPU {gpu_of_rank[r]}): {errors[r]}")

    ok = [r for r, e in enumerate(errors) if not e]
    rates = [tflops[r] or 0.0 for r in ok]
    floor = min_frac * peak if peak else None
    slow = [ok[i] for i in below(rates, floor, tolerance)]
    med = statistics.median(rates) if rates else 0.0
    ref = f"{min_frac:g} x the {peak:g} TFLOP/s peak ({peak_source})" if peak else ""
    if slow and len(slow) == len(rates):
        v.shared.append(
            f"every rank's matmul is slow ({min(rates):.3g}-{max(rates):.3g} TFLOP/s, under {ref}): "
            "set log.peak_tflops to this GPU's peak or lower health.preflight_min_frac"
        )
    for r in slow if len(slow) < len(rates) else ():
        v.add(
            nodes_of_rank[r],
            f"matmul on rank {r} (GPU {gpu_of_rank[r]}) "
            + _short(tflops[r] or 0.0, floor, med, tolerance, ref, "TFLOP/s"),
        )

    floor = min_frac * fabric_gbps if fabric_gbps else None
    slow = below(busbw, floor, tolerance)
    med = statistics.median(busbw) if busbw else 0.0
    ref = f"{min_frac:g} x {fabric_gbps:g} GB/s ({fabric_source})" if fabric_gbps else ""
    if slow and len(slow) == len(busbw):
        v.shared.append(
            f"every node pair's all-reduce is slow ({min(busbw):.3g}-{max(busbw):.3g} GB/s busbw"
            + (f", under {ref}" if ref else "")
            + "): the fabric as a whole, or its figure "
            "(health.preflight_busbw_gbps)"
        )
    else:
        bad, loose = blame_pairs(pairs, set(slow))
        for node, idx in bad.items():
            v.add(
                node,
                "all-reduce with every node it was paired with is slow: "
                + ", ".join(
                    f"{'+'.join(pairs[i])} " + _short(busbw[i], floor, med, tolerance, ref, "GB/s busbw") for i in idx
                ),
            )
        for i in loose:
            v.notes.append(
                f"node pair {'+'.join(pairs[i])}: all-reduce "
                + _short(busbw[i], floor, med, tolerance, ref, "GB/s busbw")
                + ", but each node is fast with another: the link between them, not a node (not named)"
            )

    failed = [r for r, d in enumerate(decode) if d and d.get("error")]
    if failed and len(failed) == len(decode):
        v.shared.append(f"DALI cannot decode the first train images on any rank: {decode[0]['error']}")
    else:
        for r in failed:
            v.add(nodes_of_rank[r], f"DALI decode failed on rank {r}: {decode[r]['error']}")
    return v


def failure_line(v: Verdict, reported: bool) -> str:
    """The one line every rank fails with."""
    skip = "health.preflight=false skips the check"
    if v.bad:
        names = ",".join(v.bad)
        parts = "; ".join(f"node {n}: {why}" for n, why in v.bad.items())
        where = (
            f"named in ${badnodes.ENV} for the batch shell to leave out"
            if reported
            else f"keep {'it' if len(v.bad) == 1 else 'them'} out of the next job (Slurm's --exclude={names})"
        )
        return f"preflight failed: {parts}; {where} ({skip})"
    return f"preflight failed, naming no node: {'; '.join(v.shared)} ({skip})"


# ----------------------------------------------------------------------------- measurements


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_tflops(device: torch.device, sizes: Sizes, delay_s: float = 0.0) -> float:
    """This rank's matmul rate (TFLOP/s; bf16 on GPU, float32 on CPU) from repetitions timed with
    perf_counter after a warm-up; `delay_s` (test-only hook) is slept in each repetition.

    On a GPU the rate is the median repetition's: the device is the job's alone, and a slow median
    is a slow GPU (clocks that drop under sustained load). On a CPU, ranks share cores with each
    other and with whatever else runs there, which only ever slows a repetition: the fastest one is
    the node's rate (as `timeit` takes the minimum), so a busy neighbour is not called a slow node."""
    n = sizes.matmul_n
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=gen, device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(sizes.warmup):
        torch.mm(a, b, out=c)
    _sync(device)
    t0, count = time.perf_counter(), 0
    while count < 2 or time.perf_counter() - t0 < sizes.rep_s / 4:  # calibrate: matmuls per repetition
        torch.mm(a, b, out=c)
        count += 1
        _sync(device)
    per_rep = max(1, round(count * sizes.rep_s / max(time.perf_counter() - t0, 1e-9)))
    times: list[float] = []
    end = time.perf_counter() + sizes.matmul_s
    while len(times) < 5 or time.perf_counter() < end:
        _sync(device)
        t = time.perf_counter()
        for _ in range(per_rep):
            torch.mm(a, b, out=c)
        if delay_s:
            time.sleep(delay_s)
        _sync(device)
        times.append(time.perf_counter() - t)
    rep = statistics.median(times) if device.type == "cuda" else min(times)
    return 2.0 * n**3 * per_rep / rep / 1e12


def pair_allreduce(
    nodes_of_rank: Sequence[str], rank: int, device: torch.device, sizes: Sizes
) -> list[tuple[str, str, float]]:
    """Time an all-reduce within each node pair (all ranks of both nodes), one round of disjoint pairs
    at a time; returns (a, b, busbw GB/s) of the pairs this rank led (its lowest rank). busbw as
    nccl-tests reports it: algbw × 2(n-1)/n for n ranks, the slowest rank's time counts."""
    if not td.is_initialized():
        return []
    nodes = list(dict.fromkeys(nodes_of_rank))
    ranks_of = {n: [r for r, m in enumerate(nodes_of_rank) if m == n] for n in nodes}
    out = []
    for pairing in pair_rounds(nodes):
        members = [sorted(ranks_of[a] + ranks_of[b]) for a, b in pairing]
        mine, groups = td.new_subgroups_by_enumeration(members)
        try:
            if mine is None:
                continue
            pair = next(p for p, m in zip(pairing, members) if rank in m)
            world = len(ranks_of[pair[0]]) + len(ranks_of[pair[1]])
            t = torch.zeros(sizes.allreduce_bytes // 4, dtype=torch.float32, device=device)
            for _ in range(sizes.warmup):
                td.all_reduce(t, group=mine)
            _sync(device)
            td.barrier(group=mine)
            t0 = time.perf_counter()
            for _ in range(sizes.allreduce_iters):
                td.all_reduce(t, group=mine)
            _sync(device)
            dt = torch.tensor([(time.perf_counter() - t0) / sizes.allreduce_iters], dtype=torch.float64, device=device)
            td.all_reduce(dt, op=td.ReduceOp.MAX, group=mine)
            algbw = t.numel() * 4 / float(dt.item()) / 1e9
            if rank == min(ranks_of[pair[0]] + ranks_of[pair[1]]):
                out.append((pair[0], pair[1], algbw * 2 * (world - 1) / world))
        finally:
            for g in groups:  # every rank created every group: every rank destroys them
                td.destroy_process_group(g)
    return out


def decode_sample(train_loader) -> list[bytes]:
    """The first DECODE_IMAGES encoded images of the train split the loader reads (folder or shards)."""
    listing, shards = getattr(train_loader, "listing", None), getattr(train_loader, "shards", None)
    if listing is not None:
        return [(Path(listing.root) / rel).read_bytes() for rel, _ in listing.samples[:DECODE_IMAGES]]
    from hpctrain.data.dali import wds_samples  # DALI: data.dali imports it at use (optional)

    out = []
    for tar, _key, _member, off, size in wds_samples(shards):
        with open(tar, "rb") as f:
            f.seek(off)
            out.append(f.read(size))
        if len(out) == DECODE_IMAGES:
            break
    return out


def dali_decode(cfg, train_loader, device: torch.device) -> dict | None:
    """Decode the first train images with DALI on this rank's device (nvJPEG, `mixed`, on GPU; the CPU
    decoder with device_id=None elsewhere): {"images_per_s"} or {"error"}; None when the run's loader
    is not DALI (nothing to check)."""
    if resolve_loader(cfg.data.loader) != "dali":
        return None
    try:
        import numpy as np  # with DALI: both are there whenever the loader is DALI's
        from nvidia.dali import fn, pipeline_def

        data = [np.frombuffer(b, dtype=np.uint8) for b in decode_sample(train_loader)]
        gpu = device.type == "cuda"

        @pipeline_def(
            batch_size=len(data),
            num_threads=max(1, min(4, os.cpu_count() or 1)),
            device_id=(device.index or 0) if gpu else None,
            exec_pipelined=False,
            exec_async=False,
            prefetch_queue_depth=1,
        )
        def pipe():
            return fn.decoders.image(
                fn.external_source(name="raw", dtype=None, ndim=1), device="mixed" if gpu else "cpu"
            )

        p = pipe()
        p.build()
        runs = []
        for _ in range(3):  # the first is the warm-up
            p.feed_input("raw", data)
            t = time.perf_counter()
            (out,) = p.run()
            if gpu:
                out.as_cpu()  # waits for the decode
            runs.append(time.perf_counter() - t)
        return {"images_per_s": len(data) / min(runs[1:])}
    except Exception as e:  # noqa: BLE001 - any failure of the decoder on this node is the finding
        return {"error": _first_line(e)}


def _first_line(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:200]}"


# ----------------------------------------------------------------------------- the check


def _gather(obj: Any, group, world: int) -> list[Any]:
    if world == 1 or not td.is_initialized():
        return [obj]
    out: list[Any] = [None] * world
    td.all_gather_object(out, obj, group=group)
    return out


def _fabric_figure(t) -> tuple[float | None, str]:
    """The node pair's expected busbw: health.preflight_busbw_gbps, else the table figure of the fabric
    the batch shell names (HPCTRAIN_FABRIC), else None (the median pair decides)."""
    if t.preflight_busbw_gbps:
        return t.preflight_busbw_gbps, "health.preflight_busbw_gbps"
    kind = os.environ.get(FABRIC_ENV, "")
    fig = tables.FABRICS.get(kind)
    if fig is None:
        return None, f"no fabric figure (${FABRIC_ENV} unset or unknown: {kind!r})"
    return fig.busbw_gbps, f"fabric {kind}: {fig.what}"


CPU_RETIMES = 4  # more timings of every rank while one is below the mark (CPU only)
RDMA_FABRICS = ("ib", "roce")  # fabric.kind values whose NCCL traffic GPUDirect RDMA carries


def gpudirect_warnings(ways: dict[str, tuple[str, str]]) -> list[str]:
    """One line per node whose HCAs cannot reach its GPUs' memory (`ways`: node → (way, fix), from
    site.gpudirect on each node): a warning, not a failure, since NCCL then stages its transfers
    through host memory (slower, still correct)."""
    return [
        f"{node}: no GPUDirect RDMA (NCCL stages every inter-node transfer through host memory): {fix}"
        for node, (way, fix) in sorted(ways.items())
        if not way
    ]


def _gpudirect(device: torch.device) -> tuple[str, str] | None:
    """This node's GPUDirect RDMA way and fix where it matters: CUDA over InfiniBand or RoCE."""
    if device.type != "cuda" or os.environ.get(FABRIC_ENV, "") not in RDMA_FABRICS:
        return None
    g = gpudirect.detect()
    return g.way, g.fix()


def _retimed_on_cpu(
    tf: float,
    rates: list[float],
    floor: float | None,
    tolerance: float,
    sizes: Sizes,
    delay_s: float,
    group,
    world: int,
) -> tuple[float, int]:
    """This rank's best CPU rate after up to CPU_RETIMES more timings, taken while any rank is below
    the mark, and how many were taken. On a CPU a rank that shared its cores with a busy neighbour
    for a whole timing is not a slow node: a node that is slow stays slow when timed again. The
    ranks time again one at a time (a barrier between turns), so that ranks of one job sharing a
    machine do not slow each other down (the first timing, all ranks at once, measured up to 2×
    apart on a loaded 2-core machine). Every rank takes the same decision, from the same gathered
    rates, so the collectives stay matched."""
    shared = world > 1 and td.is_initialized()
    me = td.get_rank(group) if shared else 0
    retimes = 0
    while retimes < CPU_RETIMES and below(rates, floor, tolerance):
        for turn in range(world):
            if turn == me:
                tf = max(tf, matmul_tflops(torch.device("cpu"), sizes, delay_s))
            if shared:
                td.barrier(group=group)
        rates, retimes = _gather(tf, group, world), retimes + 1
    return tf, retimes


def run(cfg, info, device: torch.device, run_dir: Path, train_loader, group=None) -> dict:
    """Check this job's nodes (collective: every rank calls it); returns the `preflight` record, or
    raises PreflightFailed on every rank after rank 0 has recorded it and named the bad nodes.

    `group` is a gloo group for the gathers (the control group on GPU; None: the default group)."""
    t = cfg.train
    t0 = time.perf_counter()
    sizes = GPU if device.type == "cuda" else CPU
    world = info.world_size
    places = _gather((badnodes.this_node(), info.local_rank), group, world)
    nodes_of_rank, gpu_of_rank = [str(p[0]) for p in places], [int(p[1]) for p in places]
    delay, where = straggler.injected_delay(info.rank)
    delay_s = delay if where == "preflight" else 0.0  # the test-only hook, in every timing
    try:
        tf, err = matmul_tflops(device, sizes, delay_s), None
    except RuntimeError as e:  # a GPU that errors (an Xid, uncorrectable ECC) is this check's finding
        tf, err = None, _first_line(e)
    # every matmul done before the all-reduces start; after an error the device may be unusable for
    # them, so the check ends there and names that node
    first = _gather((tf, err), group, world)
    errors = [e for _, e in first]
    broken, retimed = any(errors), 0
    if device.type == "cpu" and tf is not None and not broken:
        floor = cfg.health.preflight_min_frac * cfg.log.peak_tflops if cfg.log.peak_tflops else None
        tf, retimed = _retimed_on_cpu(
            tf, [x for x, _ in first], floor, cfg.health.preflight_tolerance, sizes, delay_s, group, world
        )
    led = [] if broken else pair_allreduce(nodes_of_rank, info.rank, device, sizes)
    dec = None if broken else dali_decode(cfg, train_loader, device)
    peak, peak_source = (cfg.log.peak_tflops, "log.peak_tflops") if cfg.log.peak_tflops else (None, "")
    if device.type == "cuda" and not peak:
        peak, peak_source = flops.peak_tflops(torch.cuda.get_device_name(device))
    fabric, fabric_source = _fabric_figure(t) if device.type == "cuda" else (None, "CPU: the median pair")
    rows = _gather(
        {
            "tflops": tf,
            "pairs": led,
            "decode": dec,
            "refs": (peak, peak_source, fabric, fabric_source),
            "gpudirect": _gpudirect(device),
        },
        group,
        world,
    )
    peak, peak_source, fabric, fabric_source = rows[0]["refs"]  # rank 0's: one verdict on every rank
    pairs = [(a, b) for row in rows for a, b, _ in row["pairs"]]
    busbw = [bw for row in rows for _, _, bw in row["pairs"]]
    tflops = [row["tflops"] for row in rows]
    rates = [x for x in tflops if x is not None]
    decode = [row["decode"] for row in rows]
    v = judge(
        nodes_of_rank,
        gpu_of_rank,
        tflops,
        pairs,
        busbw,
        decode,
        peak=peak,
        peak_source=peak_source,
        fabric_gbps=fabric,
        fabric_source=fabric_source,
        min_frac=cfg.health.preflight_min_frac,
        tolerance=cfg.health.preflight_tolerance,
        errors=errors,
    )
    if len(set(nodes_of_rank)) < 2:
        v.notes.append("one node: no node pair to time")
    ways = {n: row["gpudirect"] for n, row in zip(nodes_of_rank, rows) if row["gpudirect"] is not None}
    warned = gpudirect_warnings(ways) if len(set(nodes_of_rank)) > 1 else []
    if retimed:
        v.notes.append(f"CPU: every rank timed {retimed} more time(s) after one was below the mark; best figures kept")
    if broken:
        v.notes.append("a matmul failed: no all-reduce or decode check after it")
    elif decode[0] is None:
        v.notes.append(f"data.loader={resolve_loader(cfg.data.loader)}, not DALI: no decode check")
    rec = {
        "passed": v.passed,
        "seconds": round(time.perf_counter() - t0, 3),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "nodes": list(dict.fromkeys(nodes_of_rank)),
        "node_of_rank": nodes_of_rank,
        "gpu_of_rank": gpu_of_rank,
        "matmul_tflops": tflops,
        "matmul_errors": errors,
        "matmul_reference": {"peak_tflops": peak, "source": peak_source}
        if peak
        else {
            "median_tflops": statistics.median(rates) if rates else None,
            "tolerance": cfg.health.preflight_tolerance,
        },
        "pairs": [{"nodes": list(p), "busbw_GBps": bw} for p, bw in zip(pairs, busbw)],
        "allreduce_reference": {"busbw_GBps": fabric, "source": fabric_source}
        if fabric
        else {"median_GBps": statistics.median(busbw) if busbw else None, "tolerance": cfg.health.preflight_tolerance},
        "min_frac": cfg.health.preflight_min_frac,
        "decode": decode,
        "gpudirect": {n: w for n, (w, _) in ways.items()} or None,  # node → nvidia_peermem | dma-buf | ""
        "bad_nodes": v.bad,
        "shared": v.shared,
        "notes": v.notes,
    }
    reported = False
    if info.is_main:
        for node, why in v.bad.items():
            reported = badnodes.report(node, f"preflight: {why}") or reported
        rec["reported"] = reported
        m = MetricsWriter(run_dir / METRICS)
        m.write("preflight", **rec)
        m.close()
        for note in v.notes:
            log.info("preflight: %s", note)
        for line in warned:
            log.warning("preflight: %s", line)
        log.info(
            "preflight %s in %.1f s: matmul %.3g-%.3g TFLOP/s per rank; %d node pair(s)%s%s",
            "passed" if v.passed else "FAILED",
            rec["seconds"],
            min(rates, default=0),
            max(rates, default=0),
            len(pairs),
            f" at {min(busbw):.3g}-{max(busbw):.3g} GB/s busbw" if busbw else "",
            "" if decode[0] is None else "; DALI decode checked",
        )
    if device.type == "cuda" and not broken:
        torch.cuda.empty_cache()  # the check's buffers (~0.7 GB) go back before the model is built
    if td.is_initialized():
        reported = bool(_gather(reported, group, world)[0])  # rank 0 wrote the file before anyone exits
    if not v.passed:
        raise PreflightFailed(failure_line(v, reported))
    return rec

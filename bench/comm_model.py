#!/usr/bin/env python3
"""The training step split into compute, exposed communication and data wait, measured with 1 and
2 gloo ranks at the same per-rank batch, and the plan's prediction of the 2-rank step from them.

Each rank runs the real Trainer (DDP over gloo, the configured model, synthetic batches) in its
own process, torchrun-style. Per world size: the step time with gradient sync, and (2 ranks) the
same steps under DDP's `no_sync` (no all-reduce at all), interleaved in rounds so that drift in the
machine's load hits both alike; the slowest rank's mean counts, the median over rounds is kept.
The 2 ranks then measure all-reduce bus bandwidth (`hpctrain doctor --allreduce`'s code) at the DDP
bucket size. From these:

    compute        = 1-rank step − data wait
    exposed comm   = 2-rank step − 1-rank step       (same per-rank work)
                   = 2-rank step − 2-rank no_sync step (measured directly)
    predicted      = hpctrain.plan.model.step_time(compute, measured busbw, 2 ranks)

    PYTHONPATH=src python bench/comm_model.py [--config C] [--set k=v] [--steps 8] [--rounds 3]
        [--out bench/results/comm_model-cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "configs" / "digits_vit.yaml"


def config(args, world: int):
    from hpctrain.config import load

    sets = [
        "data.loader=synthetic",
        f"data.global_batch={args.per_rank_batch * world}",
        "compile.enabled=false",
        f"train.threads={args.threads}",
        "train.ema=0",
        *args.overrides,
    ]
    return load(args.config, sets)


def worker(args) -> None:
    """One rank: time sync (and no_sync) steps, count gradient bytes, measure bus bandwidth."""
    import torch
    import torch.distributed as td

    from hpctrain import allreduce
    from hpctrain.bench import cycle, time_steps
    from hpctrain.data.build import build_loaders
    from hpctrain.models.vit import build_vit
    from hpctrain.train import collective
    from hpctrain.train import dist as distmod
    from hpctrain.train.loop import build_trainer

    info = distmod.detect()
    cfg = config(args, info.world_size)
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    collective.init(info, "gloo", cfg.dist.pg_timeout_s)
    try:
        torch.manual_seed(cfg.train.seed)
        loader, _ = build_loaders(cfg, info.rank, info.world_size, device)
        trainer = build_trainer(cfg, info, device, None, loader, None, build_vit(cfg.model))
        next_batches = cycle(loader, cfg.train.accum_steps)

        def sync_step(b):
            return trainer.train_step(b)

        def local_step(b):
            with trainer.ddp.no_sync():
                return trainer.train_step(b)

        modes = {"sync": sync_step}
        if trainer.ddp is not None:
            modes["no_sync"] = local_step
        for _ in range(args.warmup):  # DDP rebuilds its buckets after the first backward
            sync_step(next_batches())
        per_mode: dict[str, list[float]] = {m: [] for m in modes}
        wait: list[float] = []
        for r in range(args.rounds):
            order = list(modes) if r % 2 == 0 else list(reversed(modes))
            for m in order:
                t = time_steps(modes[m], next_batches, args.steps, 0, device)
                per_mode[m].append(t["elapsed_s"] / args.steps)
                if m == "sync":
                    wait.append(t["data_wait_s"] / args.steps)
        grad_bytes = sum(p.numel() * p.element_size() for p in trainer.model.parameters() if p.requires_grad)
        buckets = None
        if trainer.ddp is not None:  # DDP's own buckets after its rebuild (private API: bench only)
            try:
                buckets = [
                    b.buffer().numel() * b.buffer().element_size()
                    for b in trainer.ddp.reducer._get_zeros_like_grad_buckets()
                ]
            except (AttributeError, RuntimeError):
                buckets = None
        # the slowest rank sets the pace: max over ranks of every round's mean
        keys = sorted(per_mode)
        vec = torch.tensor([v for k in keys for v in per_mode[k]] + wait, dtype=torch.float64)
        if td.is_initialized():
            td.all_reduce(vec, op=td.ReduceOp.MAX)
        vals = vec.tolist()
        out = {k: vals[i * args.rounds : (i + 1) * args.rounds] for i, k in enumerate(keys)}
        wait = vals[len(keys) * args.rounds :]
        rows = None
        if info.world_size > 1:
            bucket = min(grad_bytes, cfg.dist.ddp_bucket_mb * 2**20)
            rows = allreduce.measure(sorted({bucket, grad_bytes}), args.ar_iters, 2, device)
    finally:
        collective.shutdown()
    if info.is_main:
        print(
            json.dumps(
                {
                    "world": info.world_size,
                    "per_rank_batch": args.per_rank_batch,
                    "steps": args.steps,
                    "rounds": args.rounds,
                    "threads": args.threads,
                    "sync_s": statistics.median(out["sync"]),
                    "sync_rounds_s": out["sync"],
                    "no_sync_s": statistics.median(out["no_sync"]) if "no_sync" in out else None,
                    "no_sync_rounds_s": out.get("no_sync"),
                    "data_wait_s": statistics.median(wait),
                    "grad_bytes": grad_bytes,
                    "bucket_sizes": buckets,
                    "ddp_bucket_mb": cfg.dist.ddp_bucket_mb,
                    "allreduce": rows,
                }
            ),
            flush=True,
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(world: int, argv: list[str], timeout: float) -> dict:
    """Start `world` ranks of this script (torchrun's variables); rank 0's JSON line."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "--worker", *argv],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    for rank, (p, out) in enumerate(zip(procs, outs)):
        if p.returncode:
            raise SystemExit(f"rank {rank} of {world} failed ({p.returncode}):\n{out[-3000:]}")
    return json.loads([ln for ln in outs[0].splitlines() if ln.startswith("{")][-1])


def predict_two(cfg, two: dict, compute_s: float, wait_s: float):
    """The plan's 2-rank step (hpctrain.plan.model) from a compute time and the measured busbw."""
    from hpctrain import flops
    from hpctrain.plan import link_from_rows
    from hpctrain.plan.model import Compute, Workload, step_time

    b = two["per_rank_batch"]
    fl = flops.model_flops(cfg.model).train_flops
    compute = Compute(b * fl / compute_s / 1e12, "measured step", wait_s / b)
    bucket = cfg.dist.ddp_bucket_mb * 2**20
    link = link_from_rows(two["allreduce"], min(bucket, two["grad_bytes"]), "measured with 2 gloo ranks")
    work = Workload(fl, two["grad_bytes"], bucket, 2 * b, cfg.train.accum_steps)
    return step_time(work, 1, 2, compute, link, link), compute, link


def predict(cfg, one: dict, two: dict) -> dict:
    """The plan's 2-rank step from the 1-rank compute (what a user has before scaling out), and from
    the 2-rank no_sync compute (same load on the cores: isolates the all-reduce and overlap model)."""
    p2, compute, link = predict_two(cfg, two, one["sync_s"] - one["data_wait_s"], one["data_wait_s"])
    same, _, _ = predict_two(cfg, two, two["no_sync_s"] - two["data_wait_s"], two["data_wait_s"])
    return {
        "tflops": compute.tflops,
        "busbw_GBps": link.busbw_gbps,
        "predicted_1_s": one["sync_s"],
        "predicted_2_s": p2.step_s,
        "predicted_allreduce_s": p2.comm_s,
        "predicted_exposed_s": p2.exposed_s,
        "ratio_measured_over_predicted": two["sync_s"] / p2.step_s,
        "predicted_2_from_no_sync_s": same.step_s,
        "ratio_measured_over_predicted_from_no_sync": two["sync_s"] / same.step_s,
    }


def table(r: dict) -> str:
    one, two, p = r["one_rank"], r["two_ranks"], r["plan"]
    ms = lambda s: f"{1e3 * s:.1f} ms"
    rows = [
        ("1 rank: step", ms(one["sync_s"]), f"data wait {ms(one['data_wait_s'])}"),
        ("2 ranks: step (DDP sync)", ms(two["sync_s"]), f"no_sync {ms(two['no_sync_s'])}"),
        ("compute (1-rank step − data wait)", ms(r["compute_s"]), ""),
        ("exposed comm = 2-rank − 1-rank", ms(r["exposed_vs_1_s"]), "same per-rank batch"),
        ("exposed comm = sync − no_sync", ms(r["exposed_vs_nosync_s"]), "2 ranks, measured directly"),
        (
            "gradient bytes all-reduced / step",
            f"{two['grad_bytes']:,}",
            f"{len(two['bucket_sizes'] or [])} DDP bucket(s)",
        ),
        ("all-reduce busbw (gloo, bucket size)", f"{p['busbw_GBps']:.3f} GB/s", ""),
        ("plan: predicted 1-rank step", ms(p["predicted_1_s"]), "= compute + data wait, by construction"),
        (
            "plan: predicted 2-rank step",
            ms(p["predicted_2_s"]),
            f"from 1-rank compute; all-reduce {ms(p['predicted_allreduce_s'])}, exposed {ms(p['predicted_exposed_s'])}",
        ),
        ("measured / predicted (2 ranks)", f"{p['ratio_measured_over_predicted']:.2f}", ""),
        ("plan: predicted 2-rank step", ms(p["predicted_2_from_no_sync_s"]), "from 2-rank no_sync compute"),
        (
            "measured / predicted (2 ranks)",
            f"{p['ratio_measured_over_predicted_from_no_sync']:.2f}",
            "same load on the cores",
        ),
    ]
    w = max(len(a) for a, _, _ in rows)
    head = f"comm model: {r['config']} ({r['model']}), {one['per_rank_batch']} images per rank, gloo, CPU"
    return "\n".join([head] + [f"  {a:<{w}}  {b:>14}  {c}" for a, b, c in rows])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(DEFAULT_CONFIG), help="model (default: the digits demo's ViT)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--per-rank-batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=8, help="timed steps per round and mode (default 8)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    ap.add_argument("--ar-iters", type=int, default=5, help="timed all-reduces per size (default 5)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", help="also write the JSON record here")
    ap.add_argument("--json", action="store_true", help="print the JSON record instead of the table")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    argv = [a for a in sys.argv[1:] if a not in ("--json",)]
    if "--out" in argv:
        i = argv.index("--out")
        del argv[i : i + 2]
    started = time.time()
    one = run_world(1, argv, args.timeout)
    two = run_world(2, argv, args.timeout)
    cfg = config(args, 2)
    from hpctrain import flops

    record = {
        "config": str(args.config),
        "overrides": args.overrides,
        "model": cfg.model.arch,
        "params": flops.model_params(cfg.model),
        "one_rank": one,
        "two_ranks": two,
        "compute_s": one["sync_s"] - one["data_wait_s"],
        "exposed_vs_1_s": two["sync_s"] - one["sync_s"],
        "exposed_vs_nosync_s": two["sync_s"] - two["no_sync_s"],
        "plan": predict(cfg, one, two),
        "load_average": os.getloadavg(),
        "cpus": os.cpu_count(),
        "wall_s": time.time() - started,
        "command": "PYTHONPATH=src python bench/comm_model.py " + " ".join(argv),
    }
    text = json.dumps(record, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text if args.json else table(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

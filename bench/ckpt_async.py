#!/usr/bin/env python3
"""Sync vs async sharded checkpoints of a ViT-S (weights, AdamW state, EMA) under DDP on CPU gloo.

Two ranks train a ViT-S (its 22 M parameters; tiny 32×32 inputs so a step is short on a CPU) and
save a sharded checkpoint every `--every` steps, first synchronously, then in the background
(`dcp.async_save` on a gloo group of its own), side by side in one run. Per save: the time the
training loop is blocked (the whole save when synchronous; copying the state to CPU memory and
waiting for a save still in flight when the next starts, in the background), the save's own wall
time (until it is complete on every rank), and the training steps completed while it was in
flight. "Of it waiting" is the part of the blocked time spent waiting for the previous save (a
background save slower than `--every` steps makes training wait); a run's end waits once for its
last save ("end wait"). "Step, save in flight": the median step that started while a background
save was being written, which competes with training for the cores (and the GIL).

    PYTHONPATH=src python bench/ckpt_async.py [--saves 3] [--every 8] [--threads 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as td
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def rank_main(rank: int, world: int, port: int, args, out_dir: str, results) -> None:
    from hpctrain.config import ModelConfig
    from hpctrain.models.vit import build_vit
    from hpctrain.train.ckpt import sharded
    from hpctrain.train.optim.ema import EMA

    torch.set_num_threads(args.threads)
    td.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    bg_group = td.new_group(backend="gloo")  # background saves' collectives: not the training group's
    torch.manual_seed(0)
    model = build_vit(ModelConfig(arch="vit_small", img_size=32, num_classes=1000))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ema = EMA(model, 0.999)
    x, y = torch.randn(args.batch, 3, 32, 32), torch.randint(0, 1000, (args.batch,))

    def step():
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ema.update(model)

    def state(s):
        m, o, groups = sharded.model_optim_state(model, opt)
        return {"model": m, "optim": o, "ema": ema.state_dict()}, {"step": s, "param_groups": groups}

    for _ in range(3):
        step()  # warm-up, optimizer state created
    rows = {}
    params = sum(p.numel() for p in model.parameters())
    for mode in ("sync", "async"):
        run = Path(out_dir) / mode
        blocked, waited, walls, during, step_t, busy_t = [], [], [], [], [], []
        pending, s = None, 0
        for _ in range(args.saves):
            for _ in range(args.every):
                in_flight = pending is not None and not pending.done()
                t0 = time.perf_counter()
                step()
                (busy_t if in_flight else step_t).append(time.perf_counter() - t0)
                s += 1
                if in_flight:  # a step that started while the save was in flight
                    pending.steps += 1
            td.barrier()
            t0 = time.perf_counter()
            if pending is not None:  # the next save waits for the previous
                pending.wait()
                walls.append(pending.finished_at - pending.t0)
                during.append(pending.steps)
            waited.append(time.perf_counter() - t0)
            tensors, meta = state(s)
            if mode == "sync":
                path, err = sharded.save(run, s, tensors, meta, 2, rank == 0)
                assert err is None, err
                walls.append(time.perf_counter() - t0)
                during.append(0)
            else:
                pending = sharded.start(run, s, tensors, meta, 2, rank == 0, group=bg_group)
                pending.t0, pending.steps = t0, 0
            blocked.append(time.perf_counter() - t0)
        if pending is not None:
            t0 = time.perf_counter()
            pending.wait()  # a run's end waits for its last save (once per run, not per save)
            end_wait = time.perf_counter() - t0
            walls.append(pending.finished_at - pending.t0)
            during.append(pending.steps)
        else:
            end_wait = 0.0
        td.barrier()
        rows[mode] = {
            "blocked_s": statistics.median(blocked),
            "waited_s": statistics.median(waited),
            "end_wait_s": end_wait,
            "save_wall_s": statistics.median(walls),
            "steps_in_flight": statistics.median(during),
            "step_s": statistics.median(step_t),
            "busy_step_s": statistics.median(busy_t) if busy_t else None,
            "per_save": {"blocked_s": blocked, "save_wall_s": walls, "steps_in_flight": during},
        }
    if rank == 0:
        newest = max((Path(out_dir) / "async" / "checkpoints").glob("step-*"))
        size = sum(f.stat().st_size for f in newest.rglob("*") if f.is_file())
        results.put({"params": params, "ckpt_mb": size / 2**20, "world": world, **rows})
    td.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--saves", type=int, default=3, help="saves per mode (default 3)")
    ap.add_argument("--every", type=int, default=8, help="training steps between saves (default 8)")
    ap.add_argument("--batch", type=int, default=8, help="images per rank per step (default 8)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    ap.add_argument("--world", type=int, default=2, help="gloo ranks (default 2)")
    ap.add_argument("--dir", default=None, help="where the checkpoints go (default: a temp dir)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from hpctrain.train import compat

    if compat.version_tuple() < compat.SHARDED_MIN_TORCH:
        print(f"needs torch >= 2.4 (sharded and async checkpoints); this is {torch.__version__}", file=sys.stderr)
        return 2
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        ctx = mp.get_context("spawn")
        results = ctx.SimpleQueue()
        mp.start_processes(
            rank_main, args=(args.world, port, args, d, results), nprocs=args.world, start_method="spawn"
        )
        r = results.get()
    if args.json:
        print(json.dumps(r))
        return 0
    print(
        f"ViT-S ({r['params'] / 1e6:.1f} M parameters), checkpoint {r['ckpt_mb']:.0f} MB (weights, AdamW, "
        f"EMA), {r['world']} gloo ranks, {args.every} steps between saves, medians of {args.saves} saves"
    )
    print(
        f"{'mode':<6} {'blocked/save':>13} {'of it waiting':>14} {'save wall':>10} {'steps during save':>18} "
        f"{'step':>8} {'step, save in flight':>21}"
    )
    for mode in ("sync", "async"):
        x = r[mode]
        busy = f"{x['busy_step_s']:.3f}s" if x["busy_step_s"] is not None else "-"
        print(
            f"{mode:<6} {x['blocked_s']:>12.3f}s {x['waited_s']:>13.3f}s {x['save_wall_s']:>9.3f}s "
            f"{x['steps_in_flight']:>18.1f} {x['step_s']:>7.3f}s {busy:>21}"
        )
    print(f"end of run waiting for the last background save: {r['async']['end_wait_s']:.3f}s")
    print(f"blocked per save, async / sync: {r['async']['blocked_s'] / r['sync']['blocked_s']:.2f}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())

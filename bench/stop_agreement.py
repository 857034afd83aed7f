#!/usr/bin/env python3
"""The stop agreement's cost: one round of `train.collective.agree_bits` / `PendingBits` (an all-reduce
of 8 int32 stop bits on a gloo group) measured at 2..32 ranks over loopback TCP, and modelled to
128 and 1,024 ranks over a real fabric (hpctrain.plan.stop_cost).

Per world size, every rank (its own process, torchrun-style variables) runs:

- `round`: blocking `agree_bits` rounds back to back; a round's time is the slowest rank's, the
  median over rounds is kept (what a per-step blocking agreement would add to every step);
- `host`: what the training loop's own thread spends per round when the round overlaps a step
  (`PendingBits.start` + `PendingBits.result` once the work is complete), median over rounds:
  what the asynchronous agreement costs the step when the round finishes within the steps it has.

LOCAL_WORLD_SIZE is left out of the ranks' environment: gloo's ring all-reduce takes a
shared-memory shortcut when every rank of the group is on one node and LOCAL_WORLD_SIZE equals
the group's size (gloo/allreduce.cc, `is_intra_node`), which no multi-node job has; without it
the ranks use gloo's TCP ring, as across nodes. On a machine with fewer cores than ranks the
ranks take turns on the cores, so the larger worlds' per-hop figure includes that wait.

    PYTHONPATH=src python bench/stop_agreement.py [--worlds 2,4,8,16,32] [--rounds 300]
        [--out bench/results/stop_agreement-cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hpctrain.plan import stop_cost  # noqa: E402 - after the src path (run from a checkout)

WARMUP = 20


def worker(rounds: int, out: str) -> None:
    """One rank: `rounds` blocking rounds, then `rounds` overlapped ones; its times to `out`."""
    import datetime

    import torch
    import torch.distributed as td

    from hpctrain.train.collective import PendingBits, agree_bits

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    td.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=300),
    )
    for _ in range(WARMUP):
        agree_bits(0)
    blocking = []
    for i in range(rounds):
        t0 = time.perf_counter()
        agree_bits(1 if i == rounds - 1 and rank == world - 1 else 0)
        blocking.append(time.perf_counter() - t0)
    pending, host = PendingBits(), []
    for _ in range(rounds):
        t0 = time.perf_counter()
        pending.start(0)
        posted = time.perf_counter() - t0
        while not pending._work.is_completed():  # the round completes during the "step"
            time.sleep(0.0002)
        t0 = time.perf_counter()
        pending.result()
        host.append(posted + time.perf_counter() - t0)
    td.destroy_process_group()
    Path(out).write_text(json.dumps({"rank": rank, "blocking_s": blocking, "host_s": host}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(world: int, rounds: int, timeout: float) -> dict:
    """Start `world` ranks; the median round (slowest rank per round) and host cost."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for rank in range(world):
            env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_WORLD_SIZE", "LOCAL_RANK")}
            env.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            cmd = [sys.executable, __file__, "--worker", str(rounds), f"{tmp}/rank-{rank}.json"]
            procs.append(subprocess.Popen(cmd, env=env))
        deadline = time.monotonic() + timeout
        for p in procs:
            if p.wait(timeout=max(1.0, deadline - time.monotonic())) != 0:
                raise SystemExit(f"a rank of the {world}-rank world failed (exit {p.returncode})")
        recs = [json.loads(Path(f"{tmp}/rank-{r}.json").read_text()) for r in range(world)]
    per_round = [max(r["blocking_s"][i] for r in recs) for i in range(rounds)]
    host = [h for r in recs for h in r["host_s"]]
    round_s = statistics.median(per_round)
    return {
        "ranks": world,
        "rounds": rounds,
        "round_s": round_s,
        "round_p90_s": statistics.quantiles(per_round, n=10)[-1],
        "hops": stop_cost.ring_hops(world),
        "per_hop_s": round_s / stop_cost.ring_hops(world),
        "host_s": statistics.median(host),
    }


def model_rows(hop_s: float, host_s: float) -> list[dict]:
    """The modelled round at the job sizes the issue asks about, and K at a 15 and a 60 ms step."""
    rows = []
    for ranks in (128, 1024):
        r = stop_cost.round_s(ranks, hop_s)
        rows.append(
            {
                "ranks": ranks,
                "hops": stop_cost.ring_hops(ranks),
                "round_s": r,
                "blocking_cost_at_15ms": r / 0.015,
                "k_at_15ms": stop_cost.choose(0.015, ranks, hop_s, host_s).every,
                "k_at_60ms": stop_cost.choose(0.060, ranks, hop_s, host_s).every,
            }
        )
    return rows


def table(rec: dict) -> str:
    lines = [
        "| ranks | hops 2(p-1) | round (median) | per hop | loop's own cost per round |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for m in rec["measured"]:
        lines.append(
            f"| {m['ranks']} (measured) | {m['hops']} | {m['round_s'] * 1e3:.2f} ms | {m['per_hop_s'] * 1e6:.0f} µs "
            f"| {m['host_s'] * 1e6:.0f} µs |"
        )
    for m in rec["modelled"]:
        lines.append(
            f"| {m['ranks']} (model, {rec['hop_s'] * 1e6:.0f} µs/hop) | {m['hops']} | {m['round_s'] * 1e3:.1f} ms "
            f"| {rec['hop_s'] * 1e6:.0f} µs | {rec['host_s'] * 1e6:.0f} µs |"
        )
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), sys.argv[3])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4,8,16,32", help="comma-separated world sizes")
    ap.add_argument("--rounds", type=int, default=300, help="rounds per world size (median kept)")
    ap.add_argument("--hop-us", type=float, default=stop_cost.HOP_S * 1e6, help="the fabric's per-hop latency")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", help="also write the JSON record here")
    args = ap.parse_args()
    measured = [run_world(int(w), args.rounds, args.timeout) for w in args.worlds.split(",")]
    host = measured[0]["host_s"]  # the least crowded world: the loop's cost does not grow with ranks
    rec = {
        "command": "PYTHONPATH=src python bench/stop_agreement.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "tensor": "8 x int32 (32 bytes), ReduceOp.MAX, gloo TCP over loopback",
        "measured": measured,
        "hop_s": args.hop_us * 1e-6,
        "host_s": host,
        "modelled": model_rows(args.hop_us * 1e-6, host),
    }
    print(table(rec))
    if args.out:
        Path(args.out).write_text(json.dumps(rec, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

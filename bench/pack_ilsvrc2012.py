"""`data pack --from ilsvrc2012` as a Slurm job array: one task's rate, and ImageNet-1k's wall time at N tasks.

Writes the three official files (bench/ilsvrc_files.py: the layout tests/data/prep/test_pack_ilsvrc2012.py
checks) from realistic JPEGs (bench/loader.py's photo crops, 500×375, quality 90), plans the pack as
`data pack --slurm` does on the login node (plan_pack, write_plan; timed on a second, warm run),
then runs what one array task runs (`python -m hpctrain.data.prep.pack OUT G`: run_group, decode
check then pack) in a child process over a one-group plan: the work of a `--workers 1` pack. The
task is timed by wall clock and by its CPU time (user+sys, from inside the child so the interpreter's
start is counted once per task, not per image); on a shared, loaded machine the CPU-time rate is the
load-independent figure. The images were just written, so they are read from the page cache: the
rate is the CPU's; the file system's share is the bound from --fs-gbs.

From the CPU-time rate it prints ImageNet-1k's expected wall time at N tasks, each on a core of its
own and all running at once (queue waits not counted): planning (once, on the login node, scaled
per image from the miniature) + the largest task's images at the per-task rate, or + the time to
read both tars at --fs-gbs when that is longer. --fs-gbs defaults to an assumption, not a
measurement: give your file system's read bandwidth.

    python bench/pack_ilsvrc2012.py [--classes 8] [--per-class 200] [--val 200] [--shard-size 50]
                                    [--quality 90] [--rounds 3] [--fs-gbs 10] [--tasks 1,8,16,32,64,128]
                                    [--json OUT] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ilsvrc_files import write_official  # bench/, this script's folder
from loader import photo_jpegs

from hpctrain.data.prep import ilsvrc
from hpctrain.data.prep import pack as pk
from hpctrain.data.prep.imagenet import IMAGENET

# The official tars' sizes in bytes: image-net.org's download page says "138GB" and "6.3GB" (GiB;
# quoted with the MD5s in dmlc/gluon-cv docs/classification/imagenet-dataset.rst), the exact sizes
# are CompVis/taming-transformers taming/data/imagenet.py's SIZES (docs/data.md).
TRAIN_TAR_BYTES = 147_897_477_120
VAL_TAR_BYTES = 6_744_924_160
IMAGENET_SHARD = 1000  # `data pack --shard-size`'s default
TASKS = (1, 8, 16, 32, 64, 128)
FS_GBS = 10.0


def cpu_s(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def write_miniature(d: Path, classes: int, per_class: int, val: int, seed: int, quality: int) -> int:
    """The three files with classes × per_class train and `val` val photos; their JPEG bytes. Devkit
    IDs are a permutation (not WNID order) and one parent synset is no class, as in the real devkit."""
    rng = np.random.default_rng(seed)
    wnids = [f"n{1440764 + 1009 * k:08d}" for k in range(classes)]
    ids = {w: int(i) + 1 for w, i in zip(wnids, rng.permutation(classes))}
    jpegs = photo_jpegs(classes * per_class + val, seed, quality)
    train = {w: {f"{w}_{n}.JPEG": next(jpegs) for n in range(per_class)} for w in reversed(wnids)}
    val_files = {f"ILSVRC2012_val_{i:08d}.JPEG": (next(jpegs), wnids[i % classes]) for i in range(1, val + 1)}
    write_official(d, train, val_files, ids, {"n00001740": classes + 1})
    return sum(len(b) for files in train.values() for b in files.values()) + sum(len(b) for b, _ in val_files.values())


def plan(d: Path, out: Path, shard_size: int) -> tuple[dict, pk.PackPlan]:
    """The login node's work (index the tars' headers, read the devkit, plan, write the plan), run
    twice: the first warms the imports (scipy for meta.mat), the second is timed."""
    for _ in range(2):
        t0, c0 = time.perf_counter(), cpu_s(resource.RUSAGE_SELF)
        p = pk.plan_pack(d, out, shard_size, groups=1, log=lambda *_: None, source=ilsvrc.ILSVRC2012)
        pk.write_plan(p)
        wall, cpu = time.perf_counter() - t0, cpu_s(resource.RUSAGE_SELF) - c0
    return {"wall_s": wall, "cpu_s": cpu, "shards": len(p.shards)}, p


def task(out: str) -> int:
    """In the child: one array task's work (run_group of group 0), timed from inside; one JSON line."""
    logs: list[str] = []
    t0, c0 = time.perf_counter(), cpu_s(resource.RUSAGE_SELF)
    rc = pk.run_group(out, 0, log=logs.append)
    print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": cpu_s(resource.RUSAGE_SELF) - c0, "log": logs}))
    return rc


def run_task(out: Path) -> dict:
    """The task as a process of its own: its work (from inside) and the whole process (the start too)."""
    t0, c0 = time.perf_counter(), cpu_s(resource.RUSAGE_CHILDREN)
    r = subprocess.run([sys.executable, __file__, "--task", str(out)], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"the task failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    work = json.loads(r.stdout.splitlines()[-1])
    work.update(process_wall_s=time.perf_counter() - t0, process_cpu_s=cpu_s(resource.RUSAGE_CHILDREN) - c0)
    return work


def packed(out: Path) -> tuple[int, int]:
    """(images in the shards meta.json lists, bytes of the shards and their indexes)."""
    meta = json.loads((out / "meta.json").read_text())
    n = nbytes = 0
    for split in ("train", "val"):
        for rec in meta[split]["shards"]:
            with tarfile.open(out / rec["tar"]) as t:
                n += sum(m.name.endswith(".jpeg") for m in t.getmembers())
            nbytes += (out / rec["tar"]).stat().st_size + (out / rec["idx"]).stat().st_size
    return n, nbytes


def largest_task(tasks: int, shard_size: int) -> int:
    """Images of ImageNet-1k's largest group at `tasks` groups: PackPlan.group's split of the shards."""
    sizes = []
    for n in (IMAGENET["train"], IMAGENET["val"]):
        sizes += [shard_size] * (n // shard_size) + ([n % shard_size] if n % shard_size else [])
    groups = min(tasks, len(sizes))
    return max(sum(sizes[g * len(sizes) // groups : (g + 1) * len(sizes) // groups]) for g in range(groups))


def predict(rates: dict, tasks: list[int], fs_gbs: float) -> list[dict]:
    """ImageNet-1k's wall time at each N: plan + max(largest task at the CPU-time rate, both tars at fs_gbs)."""
    images = IMAGENET["train"] + IMAGENET["val"]
    plan_s = rates["plan_cpu_s_per_image"] * images
    fs_s = (TRAIN_TAR_BYTES + VAL_TAR_BYTES) / (fs_gbs * 1e9)
    rows = []
    for n in tasks:
        per_task = largest_task(n, IMAGENET_SHARD)
        cpu = rates["start_cpu_s"] + per_task / rates["cpu_images_per_s"]
        wall = rates["start_wall_s"] + per_task / rates["wall_images_per_s"]
        rows.append(
            {"tasks": n, "images_per_task": per_task, "task_cpu_rate_s": cpu, "task_wall_rate_here_s": wall,
             "fs_bound_s": fs_s, "plan_s": plan_s, "expected_s": plan_s + max(cpu, fs_s)}
        )  # fmt: skip
    return rows


def hms(s: float) -> str:
    s = round(s)
    if s < 60:
        return f"{s} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min" if s >= 3600 else f"{s // 60} min {s % 60:02d} s"


def report(r: dict) -> None:
    m, t, p = r["miniature"], r["task"], r["plan"]
    load = " / ".join(f"{a:.2f} {b:.2f} {c:.2f}" for a, b, c in (r["load_before"], r["load_after"]))
    print(f"machine: {os.cpu_count()} CPUs; load average (1, 5, 15 min) before / after: {load}")
    print(
        f"miniature: {m['classes']} classes, {m['train']} train + {m['val']} val JPEGs (quality {m['quality']}), "
        f"{m['mb']:.1f} MB "
        f"(mean {m['mb'] * 1e3 / m['images']:.1f} kB; ImageNet's tars: {TRAIN_TAR_BYTES / IMAGENET['train'] / 1e3:.1f} "
        f"kB per train and {VAL_TAR_BYTES / IMAGENET['val'] / 1e3:.1f} kB per val image, headers included), "
        f"{p['shards']} shards of {m['shard_size']}"
    )
    print(
        f"plan (login node, once): {p['wall_s']:.2f} s wall, {p['cpu_s']:.2f} s CPU "
        f"= {1e6 * p['cpu_s'] / m['images']:.0f} µs CPU per image (tars read from the page cache)"
    )
    print(
        f"one array task (run_group: decode check, then pack), {m['images']} images, median of "
        f"{len(t['rounds_cpu_s'])} rounds (CPU s: {', '.join(f'{x:.2f}' for x in t['rounds_cpu_s'])})"
    )
    for how, s in (("wall clock", t["wall_s"]), ("CPU time (user+sys)", t["cpu_s"])):
        print(f"  {how:>19}: {s:6.2f} s: {m['images'] / s:7.1f} images/s, {m['mb'] / s:6.2f} MB/s of images read")
    print(
        f"  process start (interpreter, imports), once per task: {t['start_wall_s']:.2f} s wall, "
        f"{t['start_cpu_s']:.2f} s CPU; each image is read twice (decode check, then pack)"
    )
    print(
        f"  shards hold {r['packed_images']} of {m['images']} images; wrote {r['packed_mb']:.1f} MB "
        f"({r['packed_mb'] / m['mb']:.2f}× the images)"
    )
    print(
        f"ImageNet-1k ({IMAGENET['train']:,} train + {IMAGENET['val']:,} val images, tars of "
        f"{TRAIN_TAR_BYTES / 1e9:.1f} + {VAL_TAR_BYTES / 1e9:.2f} GB, shards of {IMAGENET_SHARD}) at N tasks, "
        "each on a core of its own, all at once:"
    )
    print(
        f"  task = process start + largest task's images at the rate; fs bound = both tars at --fs-gbs "
        f"{r['fs_gbs']:g} GB/s ({'the default: an assumption, not a measurement' if r['fs_default'] else 'given'}); "
        "expected = plan + max(task at the CPU-time rate, fs bound)"
    )
    head = ("N", "images/task", "task, CPU rate", "task, wall rate here", "fs bound", "expected")
    print("  {:>4} {:>12} {:>15} {:>21} {:>10} {:>13}".format(*head))
    for row in r["imagenet"]:
        print(
            f"  {row['tasks']:>4} {row['images_per_task']:>12,} {hms(row['task_cpu_rate_s']):>15} "
            f"{hms(row['task_wall_rate_here_s']):>21} {hms(row['fs_bound_s']):>10} {hms(row['expected_s']):>13}"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--per-class", type=int, default=200, help="train images per class")
    ap.add_argument("--val", type=int, default=200, help="val images")
    ap.add_argument("--shard-size", type=int, default=50, help="the miniature's shard size")
    ap.add_argument("--quality", type=int, default=90, help="JPEG quality (higher: more bytes per image)")
    ap.add_argument("--rounds", type=int, default=3, help="task runs; the medians are reported")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fs-gbs", type=float, help=f"file system read bandwidth, GB/s (default {FS_GBS:g}: assumed)")
    ap.add_argument("--tasks", default=",".join(map(str, TASKS)), help="the N to predict for, comma-separated")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--keep", help="build and pack in this folder and keep it (default: a temporary one)")
    ap.add_argument("--task", help=argparse.SUPPRESS)  # the child: one array task's work on this OUT
    args = ap.parse_args()
    if args.task:
        return task(args.task)

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.keep or tmp)
        (work / "official").mkdir(parents=True)
        nbytes = write_miniature(work / "official", args.classes, args.per_class, args.val, args.seed, args.quality)
        images = args.classes * args.per_class + args.val
        p, the_plan = plan(work / "official", work / "shards", args.shard_size)
        runs = []
        for _ in range(args.rounds):
            pk.write_plan(the_plan)  # drops the last round's markers and index: the task packs again
            runs.append(run_task(work / "shards"))
        n_packed, packed_bytes = packed(work / "shards")
    t = {k: statistics.median(r[k] for r in runs) for k in ("wall_s", "cpu_s", "process_wall_s", "process_cpu_s")}
    t.update(rounds_cpu_s=[r["cpu_s"] for r in runs], rounds_wall_s=[r["wall_s"] for r in runs])
    t.update(start_wall_s=t["process_wall_s"] - t["wall_s"], start_cpu_s=t["process_cpu_s"] - t["cpu_s"])
    rates = {
        "cpu_images_per_s": images / t["cpu_s"],
        "wall_images_per_s": images / t["wall_s"],
        "cpu_mb_per_s": nbytes / 1e6 / t["cpu_s"],
        "wall_mb_per_s": nbytes / 1e6 / t["wall_s"],
        "plan_cpu_s_per_image": p["cpu_s"] / images,
        "start_cpu_s": t["start_cpu_s"],
        "start_wall_s": t["start_wall_s"],
    }
    fs_gbs = FS_GBS if args.fs_gbs is None else args.fs_gbs
    r = {
        "command": shlex.join(["python", "bench/pack_ilsvrc2012.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d"),
        "cpus": os.cpu_count(),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "miniature": {"classes": args.classes, "train": args.classes * args.per_class, "val": args.val,
                      "images": images, "mb": nbytes / 1e6, "shard_size": args.shard_size, "quality": args.quality},
        "plan": p,
        "task": t,
        "rates": rates,
        "packed_images": n_packed,
        "packed_mb": packed_bytes / 1e6,
        "fs_gbs": fs_gbs,
        "fs_default": args.fs_gbs is None,
        "imagenet": predict(rates, [int(n) for n in args.tasks.split(",")], fs_gbs),
    }  # fmt: skip
    report(r)
    if args.json:
        Path(args.json).write_text(json.dumps(r, indent=1) + "\n")
    return 0 if n_packed == images else 1


if __name__ == "__main__":
    sys.exit(main())

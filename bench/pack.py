"""`data pack` and the decode check with 1 and N processes, side by side, and the staging MB/s.

Builds the realistic JPEG set of bench/loader.py (crops of scikit-image's photos at about 500×375,
quality 90), then in alternating rounds packs it with `--workers 1` and `--workers N` and runs
the decode check of `prepare-imagenet` with 1 and N processes; prints the median seconds, the
speed-up ratios, and the throughput of staging the shards to another folder. Checks on the way
that both packs are byte for byte the same. The ratio depends on the cores and the disk: on the
2 shared cores of the development machine it says little; run it where packing happens.

    python bench/pack.py [--images 1536] [--shard-size 64] [--workers 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))


def timed(fn, *args, **kw) -> float:
    t0 = time.perf_counter()
    fn(*args, **kw)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=1536)
    ap.add_argument("--shard-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from loader import make_jpegs

    from hpctrain.data.prep.imagenet import _files, scan_images
    from hpctrain.data.prep.pack import pack
    from hpctrain.data.stage import stage

    quiet = lambda *_: None  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        make_jpegs(tmp / "set", args.images)
        paths = [str(p) for p in _files(tmp / "set" / "train")]
        mb = sum(os.path.getsize(p) for p in paths) / 1e6
        times: dict[str, list[float]] = {
            "pack 1": [],
            f"pack {args.workers}": [],
            "decode 1": [],
            f"decode {args.workers}": [],
        }
        for _ in range(args.rounds):
            for w in (1, args.workers):
                out = tmp / f"p{w}"
                shutil.rmtree(out, ignore_errors=True)
                times[f"pack {w}"].append(timed(pack, tmp / "set", out, args.shard_size, workers=w, log=quiet))
                times[f"decode {w}"].append(timed(scan_images, paths, w, log=quiet))
        names = sorted(p.name for p in (tmp / "p1").iterdir() if p.is_file())  # not .pack/ (plans differ by groups)
        same = filecmp.cmpfiles(tmp / "p1", tmp / f"p{args.workers}", names, shallow=False)[0] == names
        lines: list[str] = []
        stage(tmp / "p1", str(tmp / "local"), log=lines.append)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"{args.images} JPEGs ({mb:.1f} MB), shards of {args.shard_size}, {args.rounds} rounds, "
            f"{os.cpu_count()} CPUs; packs identical: {same}"
        )
        for k, v in med.items():
            print(f"  {k:>10} process(es): {v:6.2f} s  ({args.images / v:7.0f} images/s)")
        print(
            f"  pack speed-up {args.workers} vs 1: {med['pack 1'] / med[f'pack {args.workers}']:.2f}x; "
            f"decode check: {med['decode 1'] / med[f'decode {args.workers}']:.2f}x"
        )
        print(f"  {lines[-1]}")
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

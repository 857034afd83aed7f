"""Loader throughput side by side: hpctrain's DALI loader, a bare DALI pipeline, the PIL DataLoader.

Builds a realistic JPEG set from scikit-image's sample photos (random crops rescaled to about
500×375, quality 90, like ImageNet's typical image), then times each loader over the same files
with the same batch, output size and thread/worker count, in alternating rounds, and prints the
median images/s and the ratios. Targets (docs/performance.md): hpctrain DALI ≥ 1.5× PIL and within 10 % of
bare DALI.

    python bench/loader.py [--images 768] [--batch 64] [--threads 2] [--rounds 3] [--device cpu]
                           [--set data.crop=tf_inception --set data.antialias=false]

`--set` overrides apply to hpctrain's loaders (DALI and PIL); the bare DALI pipeline stays as it is.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def photo_jpegs(n: int, seed: int = 0, quality: int = 90) -> Iterator[bytes]:
    """n JPEGs like ImageNet's typical image: random crops of scikit-image's photos rescaled to
    500×375 (a quarter portrait), quality 90 unless told."""
    # PIL and scikit-image: heavy optional packages, needed only to make the set
    from PIL import Image
    from skimage import data

    photos = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket(), data.immunohistochemistry()]
    rng = np.random.default_rng(seed)
    for i in range(n):
        p = photos[i % len(photos)]
        h, w = p.shape[:2]
        ch, cw = int(h * rng.uniform(0.6, 1.0)), int(w * rng.uniform(0.6, 1.0))
        y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        size = (500, 375) if i % 4 else (375, 500)  # a quarter portrait
        img = Image.fromarray(p[y : y + ch, x : x + cw]).convert("RGB").resize(size, Image.BICUBIC)
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=quality)
        yield buf.getvalue()


def make_jpegs(out: Path, n: int, classes: int = 8, seed: int = 0) -> None:
    """photo_jpegs as a folder: out/train/classNN/imgNNNNN.jpg, round-robin over the classes."""
    for i, jpeg in enumerate(photo_jpegs(n, seed)):
        d = out / "train" / f"class{i % classes:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"img{i:05d}.jpg").write_bytes(jpeg)


def time_loader(make_iter, epochs: int) -> tuple[float, float]:
    """(images/s, CPU ms of this process per image) over whole epochs, epoch changes included."""
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    for _ in range(epochs):
        for x, _ in make_iter():
            n += x.shape[0]
    return n / (time.perf_counter() - t0), 1e3 * (time.process_time() - c0) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=768, help="JPEGs in the set")
    ap.add_argument("--epochs", type=int, default=3, help="epochs timed per loader and round")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--threads", type=int, default=2, help="DALI threads = PIL workers")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (DALI mixed decoding)")
    ap.add_argument("--data", help="reuse/keep the JPEG set here (default: a temp folder)")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override for hpctrain's loaders, e.g. data.crop=tf_inception",
    )
    args = ap.parse_args()

    import torch
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    from hpctrain.config import load
    from hpctrain.data.augment import AugmentSpec
    from hpctrain.data.build import build_loaders
    from hpctrain.data.folder import list_split
    from hpctrain.data.torch_loader import TorchLoader

    torch.set_num_threads(1)
    tmp = None
    if args.data:
        root = Path(args.data)
    else:
        tmp = tempfile.TemporaryDirectory()
        root = Path(tmp.name)
    if not (root / "train").is_dir():
        t0 = time.perf_counter()
        make_jpegs(root, args.images)
        print(f"wrote {args.images} JPEGs (~500×375, q90) to {root} in {time.perf_counter() - t0:.1f} s")
    listing = list_split(root, "train")
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    cfg = load(
        None,
        [
            f"data.root={root}",
            "data.loader=dali",
            f"data.global_batch={args.batch}",
            f"data.workers={args.threads}",
            f"model.img_size={args.size}",
            f"model.num_classes={len(listing.classes)}",
            "aug.hflip=0.5",
            "data.scale_min=0.08",
            *args.set,
        ],
    )
    ours, _ = build_loaders(cfg, 0, 1, device)
    epoch = {"ours": 0, "pil": 0}

    def hpctrain_dali():
        epoch["ours"] += 1
        ours.set_epoch(epoch["ours"])
        return iter(ours)

    @pipeline_def(
        batch_size=args.batch, num_threads=args.threads, seed=1, device_id=(device.index or 0) if gpu else None
    )
    def bare():
        jpegs, labels = fn.readers.file(
            file_root=str(listing.root), random_shuffle=True, name="Reader", pad_last_batch=True
        )
        imgs = fn.decoders.image_random_crop(
            jpegs,
            device="mixed" if gpu else "cpu",
            output_type=types.RGB,
            random_area=[0.08, 1.0],
            random_aspect_ratio=[3 / 4, 4 / 3],
        )
        imgs = fn.resize(imgs, size=[args.size, args.size])
        imgs = fn.crop_mirror_normalize(
            imgs,
            dtype=types.FLOAT,
            output_layout="CHW",
            mirror=fn.random.coin_flip(),
            mean=[255 * m for m in mean],
            std=[255 * s for s in std],
        )
        return imgs, labels

    bare_pipe = bare()
    bare_pipe.build()
    bare_it = DALIGenericIterator(
        [bare_pipe], ["x", "y"], reader_name="Reader", last_batch_policy=LastBatchPolicy.DROP, auto_reset=True
    )

    def bare_dali():  # one epoch of the DALI iterator (it resets itself at the end)
        return ((b[0]["x"], b[0]["y"]) for b in bare_it)

    pil = TorchLoader(
        listing,
        train=True,
        batch_size=args.batch,
        rank=0,
        world=1,
        seed=0,
        workers=args.threads,
        device=device,
        aug=AugmentSpec(
            args.size,
            0.875,
            cfg.data.scale_min,
            0.5,
            tuple(mean),
            tuple(std),
            None,
            crop=cfg.data.crop,
            antialias=cfg.data.antialias,
        ),
    )

    def pil_loader():
        epoch["pil"] += 1
        pil.set_epoch(epoch["pil"])
        return iter(pil)

    runs = {"hpctrain DALI": hpctrain_dali, "bare DALI": bare_dali, "PIL DataLoader": pil_loader}
    for make in runs.values():  # warm-up: first pipelines, worker start, page cache
        next(iter(make()))
    res: dict[str, list[float]] = {k: [] for k in runs}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(args.rounds):
        for name, make in runs.items():
            ips, ms = time_loader(make, args.epochs)
            res[name].append(ips)
            cpu[name].append(ms)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in res.items()), flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    load1 = os.getloadavg()[0]
    print(
        f"\n{len(listing)} JPEGs ~500×375 q90 → {args.size}² float NCHW, batch {args.batch}, "
        f"{args.threads} DALI threads / PIL workers, device {device}, median of {args.rounds} rounds"
    )
    print(
        f"  (load average {load1:.1f} on {os.cpu_count()} CPUs: other processes share them when it "
        "exceeds the thread count)"
    )
    for k, v in med.items():
        extra = (
            f"   {statistics.median(cpu[k]):.2f} CPU ms/image in this process"
            if "DALI" in k
            else "   (decodes in worker processes)"
        )
        print(f"  {k:15s} {v:8.0f} images/s{extra}")
    r_pil = med["hpctrain DALI"] / med["PIL DataLoader"]
    r_bare = med["hpctrain DALI"] / med["bare DALI"]
    print(f"  hpctrain DALI / PIL DataLoader = {r_pil:.2f}×  (target ≥ 1.5×)  {'OK' if r_pil >= 1.5 else 'MISSED'}")
    print(f"  hpctrain DALI / bare DALI      = {r_bare:.2f}×  (target ≥ 0.90×) {'OK' if r_bare >= 0.9 else 'MISSED'}")
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())

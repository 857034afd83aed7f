"""`hpctrain data …`: make, check and pack datasets."""

from __future__ import annotations

import argparse
import os


def add_parser(sub) -> None:
    p = sub.add_parser("data", help="datasets: digits demo set, ImageNet preparation, shards",
                       description=__doc__)
    dsub = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    d = dsub.add_parser("digits", help="write scikit-learn's 8×8 digits as an ImageNet-layout folder")
    d.add_argument("out", help="output folder (gets train/ and val/)")
    d.add_argument("--size", type=int, default=32, help="image side in pixels (default 32)")
    d.set_defaults(func=digits)

    k = dsub.add_parser("pack", help="write WebDataset tar shards + DALI index files from an ImageNet folder",
                        description="Pack ROOT/{train,val}/<class>/* into OUT/{split}-NNNNN.tar with "
                                    "DALI index files; train with data.format=wds data.root=OUT.")
    k.add_argument("root", help="ImageNet-layout folder")
    k.add_argument("out", help="output folder for the shards")
    k.add_argument("--shard-size", type=int, default=1000, help="images per shard (default 1000)")
    k.add_argument("--exclude-file", default="",
                   help="files to leave out (from prepare-imagenet --exclude-bad)")
    k.add_argument("--seed", type=int, default=0, help="seed of the train sample order (default 0)")
    k.set_defaults(func=pack)

    q = dsub.add_parser("prepare-imagenet", help="sort val, check the layout, find corrupt images",
                        description="Sort a flat val/ into class folders (--val-map), check class and "
                                    "image counts against ImageNet-1k, decode every image and list "
                                    "the ones that fail by path.")
    q.add_argument("root", help="folder with train/<class>/* and val/")
    q.add_argument("--val-map", help="ground truth for a flat val/: LOC_val_solution.csv or "
                                     "`<file> <class>` lines")
    q.add_argument("--exclude-bad", metavar="OUT", help="write the bad files here (use as data.exclude_file)")
    q.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="decode processes")
    q.add_argument("--no-scan", action="store_true", help="check the layout only, decode nothing")
    q.set_defaults(func=prepare_imagenet)


def digits(args: argparse.Namespace) -> int:
    from hpctrain.data.digits import write_digits

    counts = write_digits(args.out, args.size)
    print(f"wrote {counts['train']} train and {counts['val']} val images to {args.out}")
    return 0


def pack(args: argparse.Namespace) -> int:
    from hpctrain.data.wds import pack as write

    write(args.root, args.out, args.shard_size, args.exclude_file, args.seed)
    print(f"wrote shards to {args.out}; train with --set data.format=wds --set data.root={args.out}")
    return 0


def prepare_imagenet(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hpctrain.data.imagenet import prepare, write_exclusions

    rep = prepare(args.root, args.val_map, args.workers, scan=not args.no_scan)
    for split in rep.images:
        print(f"{split}: {rep.classes[split]} classes, {rep.images[split]:,} images")
    for n in rep.notes:
        print(f"note: {n}")
    for p in rep.problems:
        print(f"problem: {p}")
    root = Path(args.root)
    for rel, reason in rep.bad:
        print(f"bad image: {root / rel}: {reason.splitlines()[0]}")
    if args.exclude_bad:
        write_exclusions(args.exclude_bad, rep.bad, root)
        print(f"wrote {len(rep.bad)} bad files to {args.exclude_bad}; train with "
              f"--set data.exclude_file={args.exclude_bad}")
    elif rep.bad:
        print(f"{len(rep.bad)} images do not decode: write them to a list with --exclude-bad FILE "
              "and set data.exclude_file=FILE")
    if not args.no_scan and not rep.bad:
        print("every image decodes")
    return 1 if rep.problems or (rep.bad and not args.exclude_bad) else 0

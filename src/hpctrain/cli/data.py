"""`hpctrain data …`: make, check and pack datasets."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from hpctrain.cli import CLIError
from hpctrain.data.prep import hf_parquet, ilsvrc, kaggle
from hpctrain.data.prep import pack as pk
from hpctrain.data.prep.imagenet import prepare, write_exclusions
from hpctrain.data.prep.pack import pack as write
from hpctrain.data.prep.source import FOLDER
from hpctrain.launch import dryrun, pack_array
from hpctrain.launch import prepare as jobs
from hpctrain.launch.submit import Request
from hpctrain.site.slurm_cli import slurm_here

SLURM_GROUPS = 100  # default array size of `data pack --slurm`
SLURM_ONLY = ("cluster", "time", "partition", "account", "qos", "constraint", "dry_run", "wait")


def add_parser(sub) -> None:
    p = sub.add_parser("data", help="datasets: digits demo set, ImageNet preparation, shards", description=__doc__)
    dsub = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    d = dsub.add_parser("digits", help="write scikit-learn's 8×8 digits as an ImageNet-layout folder")
    d.add_argument("out", help="output folder (gets train/ and val/)")
    d.add_argument("--size", type=int, default=32, help="image side in pixels (default 32)")
    d.set_defaults(func=digits)

    k = dsub.add_parser(
        "pack",
        help="write WebDataset tar shards + DALI index files from an ImageNet folder",
        description="Pack ROOT/{train,val}/<class>/* into OUT/{split}-NNNNN.tar with "
        "DALI index files and OUT/meta.json (the shard index, written last); "
        "train with data.format=wds data.loader=dali data.root=OUT. Every image "
        "is decoded first (DALI cannot skip a bad one in training). The shards "
        "are packed in "
        "groups, by --workers processes here or, with --slurm, by the tasks "
        "of a Slurm array job; the files are the same either way, and the same "
        "command again packs only the groups not done. With --from ilsvrc2012, ROOT "
        "is the folder of the three official ILSVRC2012 files, with --from kaggle Kaggle's "
        "imagenet-object-localization-challenge folder, with --from hf-parquet Hugging Face's "
        "imagenet-1k parquet files: each read in place.",
    )
    k.add_argument(
        "root",
        help="ImageNet-layout folder, or with --from ilsvrc2012 the folder holding the official "
        f"{ilsvrc.TRAIN_TAR}, {ilsvrc.VAL_TAR} and {ilsvrc.DEVKIT}, with --from kaggle the folder "
        f"holding {kaggle.CLS_LOC}/ and {kaggle.VAL_SOLUTION}, with --from hf-parquet the folder "
        f"holding data/{hf_parquet.SPLIT_FILES['train']}",
    )
    k.add_argument("out", help="output folder for the shards")
    k.add_argument(
        "--from",
        dest="source",
        choices=tuple(pk.SOURCES),
        default=FOLDER,
        help="what ROOT is: an ImageNet-layout folder (default), or ilsvrc2012 (the official files), "
        "kaggle (Kaggle's download) or hf-parquet (Hugging Face's parquet files; needs the data extra), "
        "read in place (nothing is extracted or copied; labels in sorted-WNID order, as the extracted "
        "folder's)",
    )
    k.add_argument("--shard-size", type=int, default=1000, help="images per shard (default 1000)")
    k.add_argument("--exclude-file", default="", help="files to leave out (from prepare-imagenet --exclude-bad)")
    k.add_argument(
        "--exclude-bad",
        metavar="FILE",
        default="",
        help="leave out the images that do not decode and list them in FILE (without it, any "
        "such image refuses the pack: every image is decoded first)",
    )
    k.add_argument("--seed", type=int, default=0, help="seed of the train sample order (default 0)")
    k.add_argument(
        "--workers",
        type=int,
        default=None,
        help="shard groups packed in parallel: processes here (default 1), or array tasks "
        f"with --slurm (default one per shard, at most {SLURM_GROUPS})",
    )
    s = k.add_argument_group("Slurm (--slurm)")
    s.add_argument(
        "--slurm",
        action="store_true",
        help="pack as a Slurm array job, one task per group; run again to submit the groups "
        "that failed (finished ones are skipped) or to write the index",
    )
    s.add_argument("--cluster", help="cluster profile (default $HPCTRAIN_CLUSTER, else local)")
    s.add_argument(
        "--cluster-set",
        dest="cluster_overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a profile value, e.g. container.runtime=none",
    )
    s.add_argument("--time", help="time limit per task (default: the profile's)")
    for opt in ("partition", "account", "qos", "constraint"):
        s.add_argument(f"--{opt}", help=f"Slurm {opt} (default: the profile's)")
    dryrun.add_arg(s, "the array job")
    s.add_argument("--wait", action="store_true", help="wait for the array job, then report")
    k.set_defaults(func=pack)

    q = dsub.add_parser(
        "prepare-imagenet",
        help="sort val, check the layout, find corrupt images",
        description="Sort a flat val/ into class folders (--val-map), check class and "
        "image counts against ImageNet-1k, decode every image and list "
        "the ones that fail by path.",
    )
    q.add_argument("root", help="folder with train/<class>/* and val/")
    q.add_argument("--val-map", help="ground truth for a flat val/: LOC_val_solution.csv or `<file> <class>` lines")
    q.add_argument("--exclude-bad", metavar="OUT", help="write the bad files here (use as data.exclude_file)")
    q.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="decode processes (default: every core); any number lists the same bad files in the same order",
    )
    q.add_argument("--no-scan", action="store_true", help="check the layout only, decode nothing")
    q.set_defaults(func=prepare_imagenet)


def digits(args: argparse.Namespace) -> int:
    from hpctrain.data.prep.digits import write_digits  # numpy: not on a login node until this command runs

    counts = write_digits(args.out, args.size)
    print(f"wrote {counts['train']} train and {counts['val']} val images to {args.out}")
    return 0


def pack(args: argparse.Namespace) -> int:
    if args.slurm:
        if args.exclude_bad:
            raise CLIError(
                "--exclude-bad is for a pack here: with --slurm, each task checks its own images and "
                "fails naming the bad ones; list them with `hpctrain data prepare-imagenet ROOT "
                "--exclude-bad FILE` and pack with --exclude-file FILE"
            )
        return pack_slurm(args)
    given = [f"--{k.replace('_', '-')}" for k in SLURM_ONLY if getattr(args, k)] + (
        ["--cluster-set"] if args.cluster_overrides else []
    )
    if given:
        raise CLIError(f"{', '.join(given)} only apply to a Slurm pack: add --slurm, or leave them out")
    write(
        args.root,
        args.out,
        args.shard_size,
        args.exclude_file,
        args.seed,
        1 if args.workers is None else args.workers,
        exclude_bad=args.exclude_bad,
        source=args.source,
    )
    print(f"wrote shards to {args.out}; {train_hint(args.out)}")
    return 0


def train_hint(out: str) -> str:
    """How to train from the shards: DALI is the only loader that reads them."""
    return f"train with --set data.format=wds --set data.loader=dali --set data.root={shlex.quote(out)}"


def pack_slurm(args: argparse.Namespace) -> int:
    """Plan, write the plan under OUT/.pack, submit the array (or only its unfinished groups): a
    job like every other (launch.prepare), to a controller that answers."""
    profile = jobs.slurm_profile(args.cluster, args.cluster_overrides, slurm=True)
    assert profile is not None  # slurm=True: a profile, `local` when none is named
    req = Request(
        time=args.time, partition=args.partition, account=args.account, qos=args.qos, constraint=args.constraint
    )
    out = Path(args.out)
    here = None if args.dry_run else slurm_here()  # one ping, before the dataset is scanned (cli/submit.py)
    groups = SLURM_GROUPS if args.workers is None else args.workers
    plan = pk.plan_pack(
        args.root,
        out,
        args.shard_size,
        args.exclude_file,
        args.seed,
        groups,
        log=lambda s: print(s, file=sys.stderr),
        source=args.source,
    )  # stdout: the script of --dry-run
    p = jobs.prepare(None, profile, req, jobs.Pack(plan, args.root), dry_run=bool(args.dry_run))
    if args.dry_run:
        print(p.dry_run_text(args.dry_run), end="")
        return 0
    jobs.check_controller(profile, here)  # a controller that does not answer: one line, no sbatch, nothing written
    script = p.script()
    job = pack_array.recorded_job(out)
    if job and pack_array.job_queued(job):
        raise CLIError(
            f"array job {job} is still packing into {out}: wait for it (squeue -j {job}) "
            f"or cancel it (scancel {job}) first"
        )
    out.mkdir(parents=True, exist_ok=True)
    digest = pk.digest(pk.plan_bytes(plan))
    old = pk.load_plan(out)
    if old is not None and old[1] == digest:  # the same pack again: finish it
        missing = pk.missing_groups(plan, digest)
        if not missing:
            pk.finish(plan, digest)
            return _packed(args, plan)
        (out / pk.META).unlink(missing_ok=True)  # a lost shard: the index waits for its group again
        job = pack_array.submit(out, script, missing)
        print(
            f"submitted Slurm array job {job}: the {len(missing)} of {plan.groups} groups not packed yet "
            f"({pk.array_ranges(missing)})"
        )
    else:
        pk.write_plan(plan)
        job = pack_array.submit(out, script)
        print(f"submitted Slurm array job {job}: {plan.groups} tasks pack {len(plan.shards)} shards into {out}")
    print(
        f"logs: {out / pk.STATE / 'logs'}/; the last task writes {out / 'meta.json'}; run the same "
        "command again to resubmit failed groups",
        flush=True,
    )
    if not args.wait:
        return 0
    pack_array.wait(job)
    if pk.finish(plan, digest):
        return _packed(args, plan)
    print(
        f"hpctrain: {len(pk.missing_groups(plan, digest))} groups failed (see the logs): run the same "
        "command again to resubmit them",
        file=sys.stderr,
    )
    return 1


def _packed(args: argparse.Namespace, plan) -> int:
    print(f"all {plan.groups} groups packed: {len(plan.shards)} shards in {args.out}; {train_hint(args.out)}")
    return 0


def prepare_imagenet(args: argparse.Namespace) -> int:

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
        print(
            f"wrote {len(rep.bad)} bad files to {args.exclude_bad}; train with "
            f"--set data.exclude_file={args.exclude_bad}"
        )
    elif rep.bad:
        print(
            f"{len(rep.bad)} images do not decode: write them to a list with --exclude-bad FILE "
            "and set data.exclude_file=FILE"
        )
    if not args.no_scan and not rep.bad:
        print("every image decodes")
    return 1 if rep.problems or (rep.bad and not args.exclude_bad) else 0

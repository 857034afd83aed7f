"""`hpctrain eval`: exact top-1/top-5 and loss of a run's (or a file's) weights, per-class accuracy
and the most confused pairs; one process, every task of `torchrun` / `srun`, or (--nodes) a job
submitted like `hpctrain submit`'s: Slurm, or submitit's local executor where no Slurm answers.
Submitting imports no torch."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from hpctrain.cli import CLIError
from hpctrain.cli.common import load_config
from hpctrain.cli.job import add_job_args, goes_on, node_arg, request, show
from hpctrain.data.prep.prepare import ensure_dataset
from hpctrain.launch import dryrun
from hpctrain.launch.failure import explain
from hpctrain.launch.prepare import Eval, Prepared, check_controller, prepare, slurm_profile, start
from hpctrain.launch.submit import Submission, wait_local
from hpctrain.run.layout import CHECKPOINTS, CONFIG, RUNS, SUBMITIT, near_runs, run_dir_named
from hpctrain.run.metrics import eval_summary_table
from hpctrain.site.profile import ClusterProfile
from hpctrain.site.slurm_cli import slurm_here
from hpctrain.train import dist as distmod
from hpctrain.watch.follow import add_poll_arg, pace_of, wait_job

# flags that only a job (--nodes) takes
JOB_FLAGS = (
    "cluster",
    "cluster_overrides",
    "local",
    "gpus_per_node",
    "time",
    "partition",
    "account",
    "qos",
    "constraint",
    "exclusive",
    "dry_run",
    "wait",
    "poll",
    "local_tasks",
)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "eval", help="evaluate a run's or a file's weights on a split (exact for any world size)", description=__doc__
    )
    p.add_argument(
        "run",
        nargs="?",
        help="run directory (its newest checkpoint and its config.yaml) or a "
        "checkpoint in one (step-<n>.pt or step-<n>/)",
    )
    p.add_argument(
        "--weights",
        help="a weights file instead of RUN (.safetensors/.pt/.pth state_dict, an hpctrain checkpoint); needs --config",
    )
    p.add_argument("--config", "-c", help="config of the model and data (default with RUN: the run's config.yaml)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value (repeatable)",
    )
    p.add_argument("--data", help="dataset root (data.root)")
    p.add_argument(
        "--split",
        choices=("val", "minival"),
        help="root/val, or the 1 %% of root/train held out as minival (data.eval_splits); default: the config's",
    )
    p.add_argument("--ema", action="store_true", help="the checkpoint's EMA weights")
    p.add_argument("--img-size", type=int, help="evaluate at this resolution (position embedding resampled)")
    p.add_argument("--crop-pct", type=float, help="val resize to img_size / crop_pct, then centre crop")
    p.add_argument(
        "-o",
        "--output",
        help="folder for summary.json and per_class.csv (default RUN/eval, or "
        "FILE.eval beside the weights with --weights); rank 0 writes it",
    )
    job = p.add_argument_group("as a job, through hpctrain submit's path (--nodes submits it)")
    add_job_args(
        job,
        "submit the evaluation as a job on N nodes: Slurm with --cluster or $HPCTRAIN_CLUSTER; "
        "this machine with --local or where there is no Slurm (--nodes 1, --local-tasks processes)",
    )
    dryrun.add_arg(job, "the job")
    job.add_argument(
        "--wait",
        action="store_true",
        help="Slurm: wait for the job, then print the summary (a local job is always waited for)",
    )
    add_poll_arg(job, "--wait")
    job.add_argument("--local-tasks", type=int, help="processes of a local job (default: --gpus-per-node, else 2)")
    p.set_defaults(func=main)


def resolve(args: argparse.Namespace):
    """(config, weights source, output folder) from the command line; no torch imported."""
    if bool(args.run) == bool(args.weights):
        raise CLIError(
            "give a run directory (hpctrain eval RUN) or a weights file with its config "
            "(hpctrain eval --weights FILE --config C), not both or neither"
        )
    sets = list(args.overrides)
    sets += [f"data.root={args.data}"] if args.data else []
    sets += [f"data.eval_splits=[{args.split}]"] if args.split else []
    sets += [f"model.img_size={args.img_size}"] if args.img_size else []
    sets += [f"data.crop_pct={args.crop_pct}"] if args.crop_pct else []
    sets += ["model.init_from="]  # evaluation loads the weights given here, never the config's start
    if args.run:
        run = Path(args.run)
        if run.parent.name != CHECKPOINTS:  # a run directory, or a run's name under ./runs (as status takes it)
            run = run_dir_named(args.run) or run
        run_dir = run.parent.parent if run.parent.name == CHECKPOINTS else run
        if not run.exists() and run_dir.is_dir():
            raise CLIError(f"{args.run} does not exist: give {run_dir} (its newest checkpoint) or one in {run.parent}")
        if not run.exists():  # a mistyped run: say so, and the runs it may mean (not "has no config.yaml")
            near = near_runs(str(run_dir))
            hint = f"did you mean {' or '.join(near)}? Otherwise give" if near else "give"
            raise CLIError(
                f"{args.run} does not exist (not a run directory, nor a run name under {RUNS}/): "
                f"{hint} a run directory, or --weights FILE --config C"
            )
        config = args.config or run_dir / CONFIG
        if not Path(config).is_file():
            raise CLIError(f"{run_dir} has no config.yaml: is it a run directory? Otherwise give --config")
        out = Path(args.output) if args.output else run_dir / "eval"
        if args.split == "minival" and not args.config:
            warn_trained_on_minival(load_config(str(config), list(args.overrides)), run_dir)
        return load_config(str(config), sets), str(run), out
    if not args.config:
        raise CLIError("--weights needs --config (the model and data the weights go with)")
    return load_config(args.config, sets), args.weights, Path(args.output) if args.output else beside(args.weights)


def warn_trained_on_minival(trained, run_dir: Path) -> None:
    """minival is 1 % of root/train, held out only when the run's data.eval_splits names it: otherwise
    the run trained on those images and their accuracy overstates it."""
    if "minival" not in trained.data.eval_splits:
        print(
            f"hpctrain: warning: --split minival: {run_dir} trained on all of root/train (no minival in "
            f"data.eval_splits={list(trained.data.eval_splits)}), minival's images included, so its accuracy "
            "there overstates the model's: evaluate on val, or train with data.eval_splits=[minival]",
            file=sys.stderr,
        )


def beside(weights: str) -> Path:
    """--weights' default output folder: `<weights>.eval` next to the file (or folder), never the
    working directory, where evaluations of different weights would overwrite each other."""
    w = Path(weights)
    return w.with_name(f"{w.name}.eval")


def main(args: argparse.Namespace) -> int:
    cfg, weights, out = resolve(args)
    nodes = node_arg(args.nodes)
    if nodes is not None and not nodes.fixed:
        raise CLIError(f"--nodes {nodes}: an evaluation runs on a fixed node count; give --nodes {nodes.hi}")
    if nodes is not None:
        return submit(args, cfg, weights, out)
    given = [f for f in JOB_FLAGS if getattr(args, f) not in (None, False, [])]
    if given:
        raise CLIError(
            f"--{given[0].replace('_', '-')} is for a job: add --nodes N to submit the evaluation "
            "(without it, hpctrain eval runs in this process, or in every task of torchrun/srun)"
        )
    ensure_dataset(cfg)
    # torch: an evaluation in this process only; with --nodes this command submits from a login node without it
    from hpctrain.train.evaluate import run

    summary = run(cfg, weights, args.ema, out)
    if distmod.detect().is_main:
        print(eval_summary_table(summary))
    return 0


def print_outputs(out: Path) -> None:
    print(
        f"outputs (rank 0 writes them at the end): {shlex.quote(str(out / 'summary.json'))}, "
        f"{shlex.quote(str(out / 'per_class.csv'))}",
        flush=True,
    )


def submit(args: argparse.Namespace, cfg, weights: str, out: Path) -> int:
    """`hpctrain eval --nodes N`: the evaluation as a job, the way `hpctrain submit` starts training."""
    weights_path, out = Path(weights).expanduser().resolve(), out.expanduser().resolve()
    if args.dry_run and args.wait:
        raise CLIError("--dry-run submits nothing, so --wait has nothing to wait for: drop one of them")
    pace_of(args.poll, args.wait, "--wait")  # a bad --poll: before anything is submitted
    profile = slurm_profile(args.cluster, args.cluster_overrides, bool(args.dry_run), args.local)
    tasks = args.local_tasks or args.gpus_per_node or 2
    here = None if args.dry_run or profile is None else slurm_here()  # one ping (cli/submit.py: why first)
    p = prepare(cfg, profile, request(args), Eval(weights_path, out, args.ema, tasks), dry_run=bool(args.dry_run))
    if p.local:
        return run_local(p)
    show(p.messages, sys.stderr)
    if args.dry_run:
        print(p.dry_run_text(args.dry_run), end="")
        return 0
    assert profile is not None  # no profile is a local job (p.local above)
    check_controller(profile, here)  # a controller that does not answer: one line, no sbatch, nothing written
    sub = start(p)
    try:  # from the moment the job exists, a Ctrl-C (even before the wait) leaves it to Slurm
        return follow(args, p, profile, sub, weights_path, out)
    except KeyboardInterrupt:  # the job is Slurm's, not this process's: it goes on
        return goes_on(sub, f"end it: scancel {sub.job_id}")


def follow(
    args: argparse.Namespace, p: Prepared, profile: ClusterProfile, sub: Submission, weights_path: Path, out: Path
) -> int:
    """What a submitted evaluation job shows: where it writes, and with --wait its end and summary."""
    plan = p.plan
    print(
        f"submitted Slurm job {sub.job_id}: evaluation of {weights_path} on {plan.nodes} node(s) × "
        f"{plan.tasks_per_node} tasks (cluster {profile.name})"
    )
    print_outputs(out)
    for line in sub.snapshot.lines() if sub.snapshot else []:
        print(line)
    print(f"follow the log: {sub.log_hint}   state: squeue -j {sub.job_id}", flush=True)
    if not args.wait:
        return 0

    logs = [out / SUBMITIT / f"{sub.job_id}_0_log.{ext}" for ext in ("out", "err")]
    state = wait_job(sub.job_id, pace_of(args.poll, args.wait, "--wait"), logs, out / "summary.json")
    failed = explain(out / SUBMITIT, sub.job_id, plan.nodes * plan.tasks_per_node, "Slurm job")
    if state != "COMPLETED" and failed:
        raise failed
    if state != "COMPLETED" or not (out / "summary.json").is_file():
        print(
            f"hpctrain: job {sub.job_id} ended {state} without a summary: see {sub.log_hint.split()[-1]}",
            file=sys.stderr,
        )
        return 1
    print(eval_summary_table(json.loads((out / "summary.json").read_text())))
    return 0


def run_local(p) -> int:
    """No Slurm: the job's processes on this machine (submitit's local executor, gloo), waited for."""
    sub = start(p)
    print(f"submitted local job {sub.job_id}: evaluation of {p.kind.weights} on {p.kind.tasks} processes")
    print_outputs(p.kind.out)
    for line in sub.snapshot.lines() if sub.snapshot else []:
        print(line)
    print(f"follow the log: {sub.log_hint}", flush=True)
    print(eval_summary_table(wait_local(sub, what="finishes its evaluation (it has no checkpoint to stop at)")[0]))
    return 0

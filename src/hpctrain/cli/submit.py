"""`hpctrain submit`: start the training job on Slurm (through submitit), or locally.

Executor: --cluster / $HPCTRAIN_CLUSTER picks a profile and Slurm; --local, or a machine without
Slurm (no sbatch, or no Slurm configuration), submitit's local executor. A controller that answers
without a profile named, or one that does not answer, is refused (run `hpctrain cluster init`). Planning,
--dry-run and --emit-sbatch import neither torch nor DALI. The checks and the config the job gets:
launch.prepare; this module parses and prints.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from pathlib import Path

from hpctrain.cli import add_config_args
from hpctrain.cli.common import DEFAULT_CONFIG, load_config
from hpctrain.cli.job import add_job_args, goes_on, request, show
from hpctrain.config import check_text, to_dict
from hpctrain.launch import dryrun
from hpctrain.launch.failure import explain
from hpctrain.launch.localjob import HangupAsInterrupt, say, signal_name
from hpctrain.launch.prepare import (
    Prepared,
    Script,
    Train,
    check_controller,
    forecast,
    plan_summary,
    prepare,
    slurm_profile,
    start,
    time_to_result,
)
from hpctrain.launch.submit import Request, Submission, wait_local
from hpctrain.run import goodput
from hpctrain.run.layout import METRICS, SUBMITIT
from hpctrain.run.metrics import summary_table
from hpctrain.site.profile import ClusterProfile
from hpctrain.site.slurm_cli import slurm_here
from hpctrain.watch.follow import Endings, JobEnd, Moved, add_poll_arg, pace_of, run_files
from hpctrain.watch.progress import MetricsTail, watch
from hpctrain.watch.render import status_text
from hpctrain.watch.summary import RunStatus, run_status


def add_parser(sub) -> None:
    p = sub.add_parser(
        "submit",
        help="submit the training job (Slurm, or locally with 2 processes)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(p, default=DEFAULT_CONFIG)
    add_job_args(p, "nodes (default 1)")
    p.add_argument(
        "--gpu-mem-gb",
        type=float,
        metavar="GB",
        help="memory of one GPU for the batch-fits check (default 80: H100; H200: 141)",
    )
    dryrun.add_arg(p)
    p.add_argument(
        "--emit-sbatch",
        metavar="PATH",
        help="write the stand-alone batch script (runs `python3 -m hpctrain train`) to PATH",
    )
    p.add_argument("--wait", action="store_true", help="Slurm: wait for the job to end, print its status")
    add_poll_arg(p, "--wait")
    p.add_argument("--local-tasks", type=int, default=2, help="processes for a local run (default 2)")
    p.add_argument(
        "--spare-nodes",
        type=int,
        metavar="K",
        help="Slurm: hold K nodes more than --nodes (--no-kill), idle until a node fails; the job then "
        "goes on without it, from the last checkpoint, with no requeue (default: the profile's "
        "slurm.spare_nodes)",
    )
    p.add_argument(
        "--nsys-ranks",
        metavar="R,R",
        help="Slurm: run these global ranks under the image's `nsys profile`, recording the steps of "
        "log.profile_steps (reports: <run>/profile/nsys-rank-<r>.nsys-rep)",
    )
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    pace_of(args.poll, args.wait, "--wait")  # a bad --poll: before anything is submitted
    cfg = load_config(args.config, args.overrides, DEFAULT_CONFIG)
    profile = slurm_profile(args.cluster, args.cluster_overrides, bool(args.dry_run or args.emit_sbatch), args.local)
    if profile is None:
        return run_local(args, cfg)
    if args.emit_sbatch:
        return emit(args, cfg, profile, request(args))
    here = None if args.dry_run else slurm_here()  # one ping: a silent controller's reads then fail at once
    p = prepare(cfg, profile, request(args), Train(args.gpu_mem_gb), dry_run=bool(args.dry_run))
    if args.dry_run:
        show(p.messages, sys.stderr)  # stdout: the script, short or whole
        print(p.dry_run_text(args.dry_run), end="")
        for line in plan_summary(p):
            print(f"hpctrain: {line}", file=sys.stderr)
        print(f"hpctrain: {time_to_result(p)}", file=sys.stderr)
        return 0
    # the request's own errors first (prepare writes nothing); then a controller that does not answer:
    # one line, no sbatch, nothing written
    check_controller(profile, here)
    show(p.messages, sys.stdout)
    line, predicted = forecast(p)
    print(line, flush=True)
    sub = start(p)
    goodput.keep_plan(sub.run_dir, sub.job_id, predicted)
    try:  # from the moment the job exists, a Ctrl-C (even before the wait) leaves it to Slurm
        return follow(args, p, profile, sub)
    except KeyboardInterrupt:  # the job is Slurm's, not this process's: it goes on
        return goes_on(
            sub, f"stop it (checkpoint first): scancel --signal=USR2 {sub.job_id}   end it now: scancel {sub.job_id}"
        )


def follow(args: argparse.Namespace, p: Prepared, profile: ClusterProfile, sub: Submission) -> int:
    """What a submitted Slurm job shows: where it runs, and with --wait its progress and end."""
    plan = p.plan
    spares = f" + {plan.spare_nodes} spare node(s)" if plan.spare_nodes else ""
    print(
        f"submitted Slurm job {sub.job_id}: {plan.nodes_text} node(s) × {plan.tasks_per_node} tasks{spares} "
        f"(cluster {profile.name})"
    )
    print(f"run directory: {shlex.quote(str(sub.run_dir))}")
    for line in sub.snapshot.lines() if sub.snapshot else []:
        print(line)
    print(f"follow the logs: {sub.log_hint}   status: hpctrain status {sub.job_id}", flush=True)
    if not args.wait:
        return 0
    ended: list[RunStatus] = []

    def final() -> str:  # the job left the queue: its end, read once with the run's own (watch.jobinfo.settled_state)
        ended[:] = [run_status(str(sub.run_dir))]
        return ended[0].state

    tail = MetricsTail(sub.run_dir / METRICS)
    files = Moved(run_files(sub.run_dir, sub.job_id))
    done = JobEnd(sub.job_id, final, pace_of(args.poll, args.wait, "--wait"), files, Endings(tail))
    # rank 0's progress line while it waits, from metrics.jsonl; Slurm asked at the pace (watch/follow.py)
    watch(sub.run_dir, done, to_dict(p.cfg), poll_s=2.0, global_batch=p.cfg.data.global_batch, tail=tail)
    status = ended[0]
    print(status_text(status))
    if status.state == "COMPLETED":
        return 0
    failed = explain(sub.run_dir / SUBMITIT, sub.job_id, plan.nodes * plan.tasks_per_node, "Slurm job")
    if failed:  # a task's error; else the status above says why (a stop that was not requeued, a time limit)
        raise failed
    return 1


def emit_options(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """(flag, value) of the command that regenerates the script, in the order it is shown."""
    opts: list[tuple[str, str | None]] = [("--config", args.config)]
    if args.cluster:
        opts.append(("--cluster", args.cluster))
    opts += [("--cluster-set", o) for o in args.cluster_overrides]
    opts += [("--set", o) for o in args.overrides]
    for key in ("nodes", "gpus_per_node", "spare_nodes", "time", "partition", "account", "qos", "constraint"):
        if getattr(args, key) is not None:
            opts.append((f"--{key.replace('_', '-')}", str(getattr(args, key))))
    if args.exclusive:
        opts.append(("--exclusive", None))
    if args.gpu_mem_gb is not None:
        opts.append(("--gpu-mem-gb", f"{args.gpu_mem_gb:g}"))
    return [*opts, ("--emit-sbatch", args.emit_sbatch)]


def emit_command(args: argparse.Namespace) -> str:
    """The `Generated by` command, shell-quoted so that it can be pasted back as it was typed.
    Its values land in comment lines and a file name: control characters are refused first."""
    argv = ["hpctrain", "submit"]
    for flag, value in emit_options(args):
        argv.append(flag)
        if value is not None:
            check_text(value, flag)
            argv.append(value)
    return shlex.join(argv)


def emit(args: argparse.Namespace, cfg, profile, req: Request) -> int:
    """Write the stand-alone script. Paths stay as written: the file is for another machine."""
    kind = Script(emit_command(args), args.config, tuple(args.overrides), args.gpu_mem_gb, args.emit_sbatch)
    p = prepare(cfg, profile, req, kind)
    show(p.messages, sys.stdout)  # the notes a dry run prints, and its plan lines
    for line in plan_summary(p):
        print(f"hpctrain: {line}")
    print(f"hpctrain: {time_to_result(p)}")
    Path(args.emit_sbatch).write_text(p.script())
    plan = p.plan
    spares = f" + {plan.spare_nodes} spare node(s)" if plan.spare_nodes else ""
    print(
        f"wrote {shlex.quote(args.emit_sbatch)}: {plan.nodes_text} node(s) × {plan.tasks_per_node} tasks{spares} "
        f"(cluster {profile.name}); submit it with `sbatch {shlex.quote(args.emit_sbatch)}`"
    )
    return 0


def run_local(args: argparse.Namespace, cfg) -> int:
    p = prepare(cfg, None, Request(), Train(args.gpu_mem_gb, args.local_tasks))
    if args.spare_nodes:
        print("hpctrain: note: --spare-nodes applies to Slurm jobs only; this local run has none", file=sys.stderr)
    if args.nsys_ranks:
        print(
            "hpctrain: note: --nsys-ranks applies to Slurm jobs only; this local run runs without nsys", file=sys.stderr
        )
    show(p.messages, sys.stdout)
    sub = start(p)
    print(f"submitted local job {sub.job_id} ({args.local_tasks} processes)")
    print(f"run directory: {shlex.quote(str(sub.run_dir))}")
    for line in sub.snapshot.lines() if sub.snapshot else []:
        print(line)
    print(f"follow the logs: {sub.log_hint}", flush=True)
    interrupted = ""
    try:
        with HangupAsInterrupt():  # a closed terminal or a SIGTERM: as a Ctrl-C
            watch(sub.run_dir, sub.job.done, to_dict(cfg), global_batch=cfg.data.global_batch)  # rank 0's progress
    except KeyboardInterrupt as e:
        interrupted = signal_name(e)
    summary = wait_local(sub, interrupted=interrupted)[0]  # a Ctrl-C: every rank stops at the next step
    if summary["status"] == "interrupted":
        where = f", checkpoint {summary['checkpoint']}" if summary.get("checkpoint") else ""
        say(
            f"hpctrain: local job {sub.job_id} stopped at step {summary['step']}{where}; no process of it is "
            "left. Run the same command again to resume"
        )
        return 128 + signal.Signals[interrupted or "SIGINT"]  # the shell's status of a command a signal ended
    print(summary_table(summary))
    if summary.get("top1") is not None:
        print(f"final val top-1: {summary['top1']:.2f} % ({summary['val_count']} images)")
    return 0 if summary["status"] == "finished" else 1

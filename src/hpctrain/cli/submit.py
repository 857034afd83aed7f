"""`hpctrain submit`: start the training job on Slurm (through submitit), or locally.

Executor: --cluster / $HPCTRAIN_CLUSTER picks a profile and Slurm; otherwise Slurm when a
controller answers `scontrol ping` (profile `local`), else submitit's local executor. Planning,
--dry-run and --emit-sbatch import neither torch nor DALI.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from hpctrain.cli import CLIError, add_config_args
from hpctrain.cli.common import DEFAULT_CONFIG, load_config
from hpctrain.config import ConfigError, check_batch, check_text, to_dict
from hpctrain.data.prepare import ensure_dataset, input_problems
from hpctrain.errors import LaunchError, UserError
from hpctrain.finished import finished_run
from hpctrain.launch.batch import batch_report, check_optimizer
from hpctrain.launch.failure import explain
from hpctrain.launch.localjob import HangupAsInterrupt, say
from hpctrain.launch.progress import watch
from hpctrain.launch.status import TERMINAL, job_state, run_status, wait_job
from hpctrain.launch.submit import (
    Request,
    absolute_paths,
    check_image,
    parse_ranks,
    plan_job,
    slurm_available,
    slurm_script,
    standalone_plan,
    standalone_script,
    submit_local,
    submit_slurm,
    wait_local,
)
from hpctrain.lr_rule import lr_rule
from hpctrain.plan import build, recommend, resolve, summary
from hpctrain.plan.ckpt_cost import stop_problems, with_mtbf
from hpctrain.site.profile import load_profile
from hpctrain.train.entry import summary_table


def add_parser(sub) -> None:
    p = sub.add_parser("submit", help="submit the training job (Slurm, or locally with 2 processes)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(p, default=DEFAULT_CONFIG)
    add_job_args(p, "nodes (default 1)")
    p.add_argument("--gpu-mem-gb", type=float, metavar="GB",
                   help="memory of one GPU for the batch-fits check (default 80: H100; H200: 141)")
    p.add_argument("--dry-run", action="store_true", help="print the batch script; submit nothing")
    p.add_argument("--emit-sbatch", metavar="PATH",
                   help="write the stand-alone batch script (runs `python3 -m hpctrain train`) to PATH")
    p.add_argument("--wait", action="store_true", help="Slurm: wait for the job to end, print its status")
    p.add_argument("--local-tasks", type=int, default=2, help="processes for a local run (default 2)")
    p.add_argument("--spare-nodes", type=int, metavar="K",
                   help="Slurm: hold K nodes more than --nodes (--no-kill), idle until a node fails; the job then "
                        "goes on without it, from the last checkpoint, with no requeue (default: the profile's "
                        "slurm.spare_nodes)")
    p.add_argument("--nsys-ranks", metavar="R,R",
                   help="Slurm: run these global ranks under the image's `nsys profile`, recording the steps of "
                        "train.profile_steps (reports: <run>/profile/nsys-rank-<r>.nsys-rep)")
    p.set_defaults(func=main)


def add_job_args(p: argparse.ArgumentParser, nodes_help: str) -> None:
    """The job's resources and cluster profile; shared with `hpctrain eval --nodes`."""
    p.add_argument("--cluster", help="cluster profile: a path or a name in configs/clusters "
                                     "(default $HPCTRAIN_CLUSTER)")
    p.add_argument("--cluster-set", dest="cluster_overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="override a profile value, e.g. container.runtime=none")
    p.add_argument("--nodes", type=int, help=nodes_help)
    p.add_argument("--gpus-per-node", type=int, help="GPUs = tasks per node (default: the profile's)")
    p.add_argument("--time", help="wall-clock limit, e.g. 24:00:00")
    for opt in ("partition", "account", "qos", "constraint"):
        p.add_argument(f"--{opt}", help=f"Slurm {opt} (default: the profile's)")
    p.add_argument("--exclusive", action="store_true", default=None, help="whole nodes only")


def request(args: argparse.Namespace):
    """The Request of add_job_args' flags."""
    nsys = getattr(args, "nsys_ranks", None)
    return Request(nodes=args.nodes, gpus_per_node=args.gpus_per_node, time=args.time,
                   partition=args.partition, account=args.account, qos=args.qos,
                   constraint=args.constraint, exclusive=args.exclusive,
                   spare_nodes=getattr(args, "spare_nodes", None), nsys_ranks=parse_ranks(nsys) if nsys else ())


def main(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides, DEFAULT_CONFIG)
    cluster = args.cluster or os.environ.get("HPCTRAIN_CLUSTER")
    slurm = bool(cluster) or args.dry_run or bool(args.emit_sbatch) or slurm_available()
    if not slurm:
        return run_local(args, cfg)
    profile = load_profile(cluster or "local", args.cluster_overrides)
    req = request(args)
    if args.emit_sbatch:
        return emit(args, cfg, profile, req)
    plan = plan_job(cfg, profile, req)
    check_unfinished(cfg, args.dry_run)  # after the checks of the input: a refusal of it comes alone
    report_batch(args, cfg, plan, sys.stderr if args.dry_run else sys.stdout)  # stdout: the script
    if args.dry_run:
        warn_inputs(cfg)
        try:
            check_image(profile)
        except Exception as e:  # a dry run may plan for another machine: say so, print anyway
            print(f"hpctrain: note: {e}", file=sys.stderr)
        checkpoint_plan(cfg, profile, plan, sys.stderr)
        print(slurm_script(plan, absolute_paths(cfg).run_dir / "submitit"), end="")
        print_plan(cfg, profile, plan.nodes, plan.tasks_per_node)
        print(f"hpctrain: {time_to_result(cfg, profile, plan)}", file=sys.stderr)
        return 0
    check_image(profile)  # before anything is written or submitted: a refusal is the only line printed
    warn_inputs(cfg)
    cfg = checkpoint_plan(cfg, profile, plan, sys.stdout)
    print(time_to_result(cfg, profile, plan), flush=True)
    ensure_dataset(cfg)
    sub = submit_slurm(cfg, plan)
    spares = f" + {plan.spare_nodes} spare node(s)" if plan.spare_nodes else ""
    print(f"submitted Slurm job {sub.job_id}: {plan.nodes} node(s) × {plan.tasks_per_node} tasks{spares} "
          f"(cluster {profile.name})")
    print(f"run directory: {shlex.quote(str(sub.run_dir))}")
    for line in sub.snapshot.lines() if sub.snapshot else []:
        print(line)
    print(f"follow the logs: {sub.log_hint}   status: hpctrain status {sub.job_id}", flush=True)
    if not args.wait:
        return 0
    try:
        watch(sub.run_dir, lambda: job_state(sub.job_id) in TERMINAL, to_dict(cfg), poll_s=2.0,
              global_batch=cfg.data.batch_size)  # rank 0's progress line while it waits
        state = wait_job(sub.job_id)
    except KeyboardInterrupt:  # the job is Slurm's, not this process's: it goes on
        print(f"\nhpctrain: stopped waiting; Slurm job {sub.job_id} goes on. Follow it: {sub.log_hint}   "
              f"stop it (checkpoint first): scancel --signal=USR2 {sub.job_id}   end it now: scancel {sub.job_id}",
              file=sys.stderr)
        return 130
    print(run_status(str(sub.run_dir)).text())
    if state == "COMPLETED":
        return 0
    failed = explain(sub.run_dir / "submitit", sub.job_id, plan.nodes * plan.tasks_per_node, "Slurm job")
    if failed:  # a task's error; else the status above says why (a stop that was not requeued, a time limit)
        raise failed
    return 1


def check_unfinished(cfg, note_only: bool) -> None:
    """A finished run submitted again is refused before anything starts or waits in a queue (a dry run
    or a written script only notes it: it may be for another machine's run directory)."""
    text = finished_run(cfg)
    if text and note_only:
        print(f"hpctrain: note: {text}", file=sys.stderr)
    elif text:
        raise LaunchError(text)


def checkpoint_plan(cfg, profile, plan, out):
    """Warn when a stop (the time-limit signal's lead, the partition's GraceTime) is shorter than two
    steps plus a save; with train.ckpt_every=auto, the config with the job's MTBF resolved here (the
    task has no Slurm client to read the partition's history) and one line on `out` saying so."""
    for problem in stop_problems(cfg, profile, plan.partition, plan.nodes, plan.tasks_per_node):
        print(f"hpctrain: warning: {problem}", file=sys.stderr)
    cfg, line = with_mtbf(cfg, profile, plan.partition, plan.nodes)
    if line:
        print(line, file=out)
    return cfg


def warn_inputs(cfg) -> None:
    """Slurm: a missing data.root or model.init_from is a note, not a refusal: the cluster's nodes may
    see paths this machine does not (a dry run may even plan for another cluster), as check_image's."""
    for problem in input_problems(cfg):
        print(f"hpctrain: note: not on this machine (the job fails unless its nodes see it): {problem}",
              file=sys.stderr)


def print_plan(cfg, profile, nodes: int, gpus_per_node: int) -> None:
    """`hpctrain plan`'s summary on stderr (stdout stays the batch script); GPU jobs only."""
    if not profile.slurm.request_gpus:
        return
    try:
        lines = summary(cfg, profile, nodes, gpus_per_node)
    except UserError as e:  # a dry run never fails for want of a plan
        lines = [f"plan: not available ({e})"]
    for line in lines:
        print(f"hpctrain: {line}", file=sys.stderr)


def time_to_result(cfg, profile, plan) -> str:
    """`hpctrain plan`'s one line for this request: queue wait (the partition's sacct history), and
    for a GPU job the predicted training, interruption loss, time to result and allocation share."""
    ctx = recommend.read_context(profile, plan.partition, account=plan.account)
    if not profile.slurm.request_gpus:  # the step model is for GPUs: the queue alone
        return recommend.queue_line(ctx, plan.nodes)
    try:
        train = build(cfg, resolve(cfg, profile, plan.nodes, plan.tasks_per_node, counts=[plan.nodes]))
    except UserError as e:  # no training-time figure (an unknown GPU, no image count): the queue alone
        return f"{recommend.queue_line(ctx, plan.nodes)}; training time: not available ({e})"
    opts = recommend.options(cfg, profile, train, ctx, plan.tasks_per_node)
    return recommend.one_line(opts[0] if opts else None, ctx, plan.nodes)


def report_batch(args: argparse.Namespace, cfg, plan, out) -> None:
    """Print the per-GPU batch, the memory estimate and the resolved lr; warn below 32 images per GPU;
    refuse a per-GPU batch that cannot fit (before anything is written or submitted)."""
    check_optimizer(cfg)
    rep = batch_report(cfg, plan.nodes, plan.tasks_per_node, args.gpu_mem_gb,
                       gpus=plan.profile.slurm.request_gpus)
    rep.check(cfg)
    for line in [*rep.lines(), f"lr: {lr_rule(cfg)}"]:
        print(line, file=out)
    warning = rep.warning(cfg)
    if warning:
        print(f"hpctrain: warning: {warning}", file=sys.stderr)
    out.flush()


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


def emit(args: argparse.Namespace, cfg, profile, req) -> int:
    """Write the stand-alone script. Paths stay as written: the file is for another machine."""
    command = emit_command(args)
    plan = standalone_plan(cfg, profile, req, command, args.config, args.overrides)
    check_unfinished(cfg, note_only=True)
    report_batch(args, cfg, plan, sys.stdout)
    Path(args.emit_sbatch).write_text(standalone_script(plan))
    spares = f" + {plan.spare_nodes} spare node(s)" if plan.spare_nodes else ""
    print(f"wrote {shlex.quote(args.emit_sbatch)}: {plan.nodes} node(s) × {plan.tasks_per_node} tasks{spares} "
          f"(cluster {profile.name})")
    return 0


def check_inputs(cfg) -> None:
    """A local job reads this machine's files: refuse a missing input before anything starts."""
    problems = input_problems(cfg)
    if problems:
        raise ConfigError("; ".join(problems))


def run_local(args: argparse.Namespace, cfg) -> int:
    if args.local_tasks < 1:
        raise CLIError(f"--local-tasks={args.local_tasks}: need at least 1 process")
    if args.spare_nodes:
        print("hpctrain: note: --spare-nodes applies to Slurm jobs only; this local run has none", file=sys.stderr)
    if args.nsys_ranks:
        print("hpctrain: note: --nsys-ranks applies to Slurm jobs only; this local run runs without nsys",
              file=sys.stderr)
    check_batch(cfg, args.local_tasks)
    check_unfinished(cfg, note_only=False)
    print(f"batch: {cfg.data.batch_size} global = {cfg.per_rank_batch(args.local_tasks)} per process × "
          f"{args.local_tasks} processes; lr: {lr_rule(cfg)}")
    ensure_dataset(cfg)
    check_inputs(cfg)
    sub = submit_local(cfg, tasks=args.local_tasks)
    print(f"submitted local job {sub.job_id} ({args.local_tasks} processes)")
    print(f"run directory: {shlex.quote(str(sub.run_dir))}")
    for line in sub.snapshot.lines() if sub.snapshot else []:
        print(line)
    print(f"follow the logs: {sub.log_hint}", flush=True)
    interrupted = False
    try:
        with HangupAsInterrupt():  # a closed terminal or a SIGTERM: as a Ctrl-C
            watch(sub.run_dir, sub.job.done, to_dict(cfg), global_batch=cfg.data.batch_size)  # rank 0's progress
    except KeyboardInterrupt:
        interrupted = True
    summary = wait_local(sub, interrupted=interrupted)[0]  # a Ctrl-C: every rank stops at the next step
    if summary["status"] == "interrupted":
        where = f", checkpoint {summary['checkpoint']}" if summary.get("checkpoint") else ""
        say(f"hpctrain: local job {sub.job_id} stopped at step {summary['step']}{where}; no process of it is "
            "left. Run the same command again to resume")
        return 130
    print(summary_table(summary))
    if summary.get("top1") is not None:
        print(f"final val top-1: {summary['top1']:.2f} % ({summary['val_count']} images)")
    return 0 if summary["status"] == "finished" else 1

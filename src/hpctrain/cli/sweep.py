"""`hpctrain sweep`: many runs of one config as one Slurm job array, or one after another locally.

  hpctrain sweep --config C --grid optim.lr=1e-3,5e-4 --grid model.drop_path=0,0.1 --max-parallel 2

Members: every point of the grids (and of a --sweep-file's `grid:`), then its `runs:` list. Each
member is a run of its own under runs/<sweep>/<member>/ (its job id <array>_<i>, its requeues and
resume); runs/<sweep>/sweep.json lists them; `hpctrain status runs/<sweep>` prints the table.
Every member's config is checked before anything is submitted. With --local, or on a machine
without Slurm, the members run one after another through the local executor.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from pathlib import Path

from hpctrain.cli import CLIError, add_config_args
from hpctrain.cli.common import DEFAULT_CONFIG, load_config
from hpctrain.cli.job import request, show
from hpctrain.config import SET_ENV, check_text, decode_overrides
from hpctrain.launch import dryrun, sweep
from hpctrain.launch.prepare import check_controller, prepare_sweep, slurm_profile, start_sweep
from hpctrain.site.slurm_cli import slurm_here


def add_parser(sub) -> None:
    p = sub.add_parser(
        "sweep",
        help="many runs of one config: a Slurm job array (or locally, one by one)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(p, default=DEFAULT_CONFIG)
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="values of one key (repeatable: the members are every combination)",
    )
    p.add_argument("--sweep-file", metavar="YAML", help="grid: {key: [values]} and/or runs: [{key: value}]")
    p.add_argument("--name", help="sweep name: runs/<name>/ (default <run.name>-sweep)")
    p.add_argument(
        "--max-parallel",
        type=int,
        default=0,
        metavar="K",
        help="Slurm: at most K members at a time (--array=…%%K; default all)",
    )
    p.add_argument("--max-runs", type=int, default=None, metavar="N", help="allow up to N members (default 64)")
    p.add_argument("--cluster", help="cluster profile (default $HPCTRAIN_CLUSTER)")
    p.add_argument("--cluster-set", dest="cluster_overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--nodes", metavar="N|MIN-MAX", help="nodes per member (default 1)")
    p.add_argument("--gpus-per-node", type=int, help="GPUs = tasks per node (default: the profile's)")
    p.add_argument("--time", help="wall-clock limit of each member")
    for opt in ("partition", "account", "qos", "constraint"):
        p.add_argument(f"--{opt}", help=f"Slurm {opt} (default: the profile's)")
    p.add_argument("--exclusive", action="store_true", default=None, help="whole nodes only")
    p.add_argument("--gpu-mem-gb", type=float, metavar="GB", help="memory of one GPU for the batch check")
    dryrun.add_arg(p, "the members and the array job")
    p.add_argument("--local-tasks", type=int, default=2, help="processes per member for a local sweep (default 2)")
    p.add_argument(
        "--local", action="store_true", help="run the members on this machine, even where Slurm is configured"
    )
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:

    base = load_config(args.config, args.overrides, DEFAULT_CONFIG)  # the base itself must be valid
    config = args.config or os.environ.get("HPCTRAIN_CONFIG") or DEFAULT_CONFIG
    base_overrides = decode_overrides(os.environ.get(SET_ENV, "")) + list(args.overrides)
    name = args.name or f"{base.run.name}-sweep"
    check_text(name, "--name")
    if not re.match(r"^[^/.][^/]*$", name):
        raise CLIError(f"--name {name!r}: one plain path component (no '/', no leading dot), e.g. lr-sweep")
    if args.max_parallel < 0 or (args.max_runs is not None and args.max_runs < 1):
        raise CLIError("--max-parallel and --max-runs take positive numbers (--max-parallel 0: all at once)")
    grid = sweep.parse_grid(args.grid)
    runs: list[list[str]] = []
    if args.sweep_file:
        fgrid, runs = sweep.read_sweep_file(args.sweep_file)
        for key, values in fgrid.items():
            if key in grid:
                raise CLIError(f"{key} is in both --grid and {args.sweep_file}: give it once")
            grid[key] = values
    sweep_dir = Path(base.run.dir).expanduser().resolve() / name
    members = sweep.plan_members(
        config, base_overrides, sweep.expand(grid, runs), sweep_dir, args.max_runs or sweep.DEFAULT_MAX_RUNS
    )
    profile = slurm_profile(args.cluster, args.cluster_overrides, bool(args.dry_run), args.local)
    if profile is None:
        note_ignored(args)
        return run_local(args, members, sweep_dir, name, config, base_overrides)
    here = None if args.dry_run else slurm_here()  # one ping (cli/submit.py: why first)
    p = prepare_sweep(
        members, profile, request(args), sweep_dir, name, args.max_parallel, args.gpu_mem_gb, dry_run=bool(args.dry_run)
    )
    show(p.messages, sys.stderr)
    for m in p.members:
        print(f"member {m.index}: {m.name}  {shlex.join(m.overrides)}", file=sys.stderr if args.dry_run else sys.stdout)
    if args.dry_run:
        print(p.dry_run_text(args.dry_run), end="")
        return 0
    check_controller(profile, here)  # a controller that does not answer: one line, no sbatch, nothing written
    array, snap = start_sweep(p, name, config, base_overrides)
    plan = p.plan
    print(
        f"submitted Slurm job array {array}: {len(members)} runs, {plan.array.split('%')[1]} at a time, "
        f"{plan.nodes} node(s) × {plan.tasks_per_node} tasks each (cluster {plan.profile.name})"
    )
    for line in snap.lines() if snap else []:
        print(line)
    print(f"sweep directory: {shlex.quote(str(sweep_dir))}   status: hpctrain status {shlex.quote(str(sweep_dir))}")
    return 0


SLURM_ONLY = (
    "max_parallel",
    "cluster_overrides",
    "nodes",
    "gpus_per_node",
    "time",
    "partition",
    "account",
    "qos",
    "constraint",
    "exclusive",
    "gpu_mem_gb",
)


def note_ignored(args: argparse.Namespace) -> None:
    """A local sweep runs its members one after another on this machine: the flags of a Slurm array
    (parallelism, profile values, resources) have nothing to act on; say so instead of dropping them."""
    given = [
        f"--{k.replace('_overrides', '_set').replace('_', '-')}"
        for k in SLURM_ONLY
        if getattr(args, k) not in (None, False, 0, [])
    ]
    if given:
        print(
            f"hpctrain: note: a local sweep (--local, or no Slurm here): the members "
            f"run one after another on this machine, so {', '.join(given)} (for a Slurm sweep) "
            f"{'is' if len(given) == 1 else 'are'} ignored",
            file=sys.stderr,
        )


def run_local(args, members, sweep_dir, name, config, base_overrides) -> int:
    members = prepare_sweep(members, None, request(args), sweep_dir, name, tasks=args.local_tasks).members
    sweep.check_new(sweep_dir)
    print(
        f"no Slurm: {len(members)} runs one after another, {args.local_tasks} processes each "
        f"(sweep directory {shlex.quote(str(sweep_dir))})",
        flush=True,
    )
    record = sweep.new_record(name, config, base_overrides, members, "local")
    statuses = sweep.run_local(members, sweep_dir, record, args.local_tasks, sys.stdout)
    print(sweep.sweep_table(sweep.sweep_status(sweep_dir), f"sweep {name}"))
    if "interrupted" in statuses:  # Ctrl-C: that member stopped with a checkpoint, the rest never started
        return 130
    return 0 if all(s == "finished" for s in statuses) else 1

"""`hpctrain sync RUN`: upload a run's offline tracker records from the login node (which has the network).

W&B: every attempt of the run left an `offline-run-<time>-<id>/` under `<run>/wandb/`, all with the
run's id; `wandb sync --id <id>` uploads them into that one run in order of start time (`wandb sync
--help`, wandb 0.31). MLflow: `<run>/mlruns` is a file store MLflow reads in place; this prints how to
look at it or move it to a tracking server. Imports no torch/numpy: wandb runs as its own command.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
from pathlib import Path

from hpctrain.cli import CLIError
from hpctrain.config import load
from hpctrain.run.layout import CONFIG, run_dir_named
from hpctrain.train.observe.trackers import run_key


def add_parser(sub) -> None:
    p = sub.add_parser(
        "sync", help="upload a run's offline W&B records; say how to publish its MLflow store", description=__doc__
    )
    p.add_argument("run", metavar="RUN", help="run directory (runs/<name>) or a run name under ./runs")
    p.add_argument("--dry-run", action="store_true", help="print the wandb command instead of running it")
    p.set_defaults(func=main)


def wandb_command(run: Path, project: str) -> list[str] | None:
    """The `wandb sync` line for this run's offline attempts (None: the run has none)."""
    key = run_key(run)
    dirs = sorted((run / "wandb").glob(f"offline-run-*-{key}"))
    if not dirs:
        return None
    return ["wandb", "sync", "--id", key, "--project", project, *map(str, dirs)]


def main(args: argparse.Namespace) -> int:
    run = run_dir_named(args.run)
    if run is None:
        raise CLIError(f"no run at {args.run}: give a run directory (runs/<name>, with its config.yaml) or a run name")
    t = load(run / CONFIG).log
    did = False
    cmd = wandb_command(run, t.wandb_project)
    if cmd:
        did = True
        if args.dry_run:
            print(shlex.join(cmd))
        else:
            if shutil.which("wandb") is None:
                raise CLIError(
                    "the wandb command is not installed here: pip install wandb (and wandb login), "
                    "then run hpctrain sync again"
                )
            r = subprocess.run(cmd)
            if r.returncode:
                raise CLIError(
                    f"wandb sync exited with {r.returncode} (see its output above); "
                    "fix that (wandb login?) and run hpctrain sync again"
                )
    store = run / "mlruns"
    if store.is_dir() and not t.mlflow_uri:
        did = True
        print(
            f"MLflow: {store} is a file store MLflow reads in place: MLFLOW_ALLOW_FILE_STORE=true mlflow server "
            f"--backend-store-uri {shlex.quote(store.as_uri())}; to publish it, copy the directory to a server's "
            "file store or migrate it (mlflow migrate-filestore; docs/trackers.md)"
        )
    if not did:
        raise CLIError(
            f"{run} has no offline W&B records nor a local MLflow store: train with "
            "log.trackers=[mlflow,wandb] (or the one you use)"
        )
    return 0

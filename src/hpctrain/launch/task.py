"""What every task of a submitit job runs: `python -m hpctrain.launch.task <submitit folder>`.

submitit's own runner (`submitit.core._submit`) installs handlers that would fight ours: USR2 →
checkpoint-and-requeue of the pickled call through `scontrol` (absent inside the container) and
SIGTERM → ignored (so a preempted task would train on until SIGKILL). This entry installs
hpctrain's stop handlers first, before any heavy import, tells submitit to leave the signals
alone, then lets submitit load and run the pickled `train_task` (or `eval_task`). submitit is
reached through launch.submitit_glue, imported inside the functions below: not at module import,
so never before the stop handlers are installed.

The login node imports this module too: `hpctrain submit` and `sweep` (launch.submit, launch.sweep)
hand submitit `train_task` and `eval_task`, which it pickles by name. So the training core
(train.entry, train.evaluate, and torch under them) is imported inside those two functions, where the
task starts training or evaluating, after the stop handlers: never on the login node.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpctrain.config import Config, build
from hpctrain.errors import LaunchError
from hpctrain.launch import failure, localjob
from hpctrain.launch.private import check_pickle
from hpctrain.train import stop as stopmod
from hpctrain.train.dist import port_from_job_id


def export_job_env() -> None:
    """Under submitit's local executor: RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* from its job
    environment (overwriting whatever the submitting shell had). Under Slurm, Slurm's own
    variables decide (train.dist.detect)."""
    if os.environ.get("SLURM_STEP_ID"):
        return
    from hpctrain.launch import submitit_glue  # submitit: after the stop handlers, not at module import

    env = submitit_glue.job_env()
    os.environ.update(
        {
            "RANK": str(env.global_rank),
            "WORLD_SIZE": str(env.num_tasks),
            "LOCAL_RANK": str(env.local_rank),
            "LOCAL_WORLD_SIZE": str(env.num_tasks // max(1, env.num_nodes)),
            "MASTER_ADDR": env.hostnames[0] if env.hostnames else "127.0.0.1",
            "MASTER_PORT": str(port_from_job_id(env.job_id)),
            "HPCTRAIN_LAUNCHER": "submitit-local",
        }
    )


def task_started() -> tuple[Path, str, int]:
    """(submitit folder, job id, global rank) of this task; a local job's task leaves its pid and
    takes its own process group (launch.localjob). Call once the stop handlers are installed."""
    from hpctrain.launch import submitit_glue  # submitit: after the stop handlers, not at module import

    env = submitit_glue.job_env()
    where = (env.paths.folder, env.job_id, env.global_rank)
    localjob.task_started(*where)
    print(start_line(env.job_id, env.global_rank, os.environ), file=sys.stderr, flush=True)
    return where


def start_line(job_id: str, rank: int, env: Mapping[str, str]) -> str:
    """The first line of every attempt in a task's log: the logs are appended to across requeues
    and in-job restarts (launch/shell/step_loop.sh: srun --open-mode=append), so each attempt's
    lines start below its own."""
    return (
        f"hpctrain: task rank {rank} of job {job_id} started on {socket.gethostname()} at "
        f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} (Slurm restart {env.get('SLURM_RESTART_COUNT', '0')}, "
        f"attempt {env.get('HPCTRAIN_ATTEMPT', '0')} in the allocation)"
    )


def train_task(cfg: dict[str, Any]) -> dict[str, Any]:
    """Train; after a stop that the batch shell will requeue, exit without a result (the job
    runs again). SystemExit is not an Exception, so submitit writes no result file for it. A
    UserError leaves its record for the submitter's one-line report (launch.failure)."""
    stop = stopmod.install(interrupt=True)  # main() did under Slurm; here for the local executor
    with failure.recorded(*task_started()):
        export_job_env()
        # torch: the task's training core, never on the login node (which imports this module: see above)
        from hpctrain.train import entry

        summary = entry.run(cfg, stop)
    if summary.get("requeue"):
        raise SystemExit(0)
    return summary


def eval_task(cfg: dict[str, Any], weights: str, ema: bool, out: str) -> dict[str, Any]:
    """`hpctrain eval` on every task of the job (train/evaluate.run); rank 0 writes `out`. The stop
    handlers are the training task's: an evaluation has no checkpoint, so a stop lets it finish
    (before the time limit's SIGKILL), and a preempted one is requeued by the batch shell and
    starts over."""
    stopmod.install(interrupt=True)  # main() did under Slurm; here for the local executor
    with failure.recorded(*task_started()):
        export_job_env()
        # torch: the task's evaluation, never on the login node (which imports this module: see above)
        from hpctrain.train import evaluate

        return evaluate.run(build(Config, cfg), weights, ema, Path(out))


def main(argv: list[str] | None = None) -> None:
    stopmod.install(interrupt=True)
    from hpctrain.launch import submitit_glue  # submitit: after stopmod.install, not at module import

    submitit_glue.leave_signals_alone()
    want = os.environ.get("HPCTRAIN_SUBMITIT_VERSION")
    if want and want != submitit_glue.VERSION:  # the pickled job is read by this process's submitit
        raise SystemExit(
            f"hpctrain: the job was submitted with submitit {want} but this task has "
            f"{submitit_glue.VERSION}: install submitit=={want} in the image (the recipes pin it)"
        )
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m hpctrain.launch.task <submitit folder>")
    os.environ["SUBMITIT_FOLDER"] = args[0]  # as process_job sets it: this task's own pickle
    try:
        check_pickle(submitit_glue.submitted_pickle())
    except LaunchError as e:
        raise SystemExit(f"hpctrain: {e}") from None
    submitit_glue.run_pickled(args[0])


if __name__ == "__main__":
    main()

"""Submit the training job through submitit: Slurm when a controller answers, else locally."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.config import Config, to_dict


class LaunchError(RuntimeError):
    """A job that cannot be planned or submitted, with the fix in the message."""


@dataclass(frozen=True)
class Submission:
    job_id: str
    run_dir: Path
    executor: str  # slurm | local
    log_hint: str
    job: Any = None


def slurm_available() -> bool:
    """A controller answers `scontrol ping` (sbatch merely being installed is not enough)."""
    if not shutil.which("scontrol"):
        return False
    try:
        r = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0 and " is UP" in r.stdout


def absolute_paths(cfg: Config) -> Config:
    """Jobs may start elsewhere: pin run.dir and data.root to absolute paths at submission."""
    data = cfg.data
    if data.root:
        data = dataclasses.replace(data, root=str(Path(data.root).expanduser().resolve()))
    run = dataclasses.replace(cfg.run, dir=str(Path(cfg.run.dir).expanduser().resolve()))
    return dataclasses.replace(cfg, data=data, run=run)


def submit_local(cfg: Config, tasks: int = 2, timeout_min: int = 600) -> Submission:
    """Run the job on this machine with submitit's local executor (`tasks` DDP processes, gloo)."""
    import submitit

    from hpctrain.launch.task import train_task

    cfg = absolute_paths(cfg)
    folder = cfg.run_dir / "submitit"
    folder.mkdir(parents=True, exist_ok=True)
    ex = submitit.LocalExecutor(folder=folder)
    ex.update_parameters(tasks_per_node=tasks, nodes=1, timeout_min=timeout_min)
    job = ex.submit(train_task, to_dict(cfg))
    return Submission(str(job.job_id), cfg.run_dir, "local",
                      f"tail -f {folder}/{job.job_id}_0_log.out", job)


def wait_local(sub: Submission, poll_s: float = 1.0) -> list[dict]:
    """Wait for every task's result (raises the task's error when one failed)."""
    while not sub.job.done():
        time.sleep(poll_s)
    return sub.job.results()

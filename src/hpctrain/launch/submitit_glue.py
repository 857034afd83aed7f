"""submitit, in one module: the only one of hpctrain that imports it (tests/test_import_graph.py).

hpctrain keeps submitit's pickled calls, job folders, result files and array naming, and replaces
two of its parts: the batch script (ours carries the container, stops and requeue: launch.sbatch)
and the task's signal handlers (ours stop at a step boundary: train.stop). Both are private
methods of submitit, so the version is pinned (pyproject.toml, and the images: recipes/*.def), and
CONTRACT lists every private name used here with the parameters relied on, which
tests/launch/test_submitit_contract.py checks against the installed submitit.

The task side (launch.task) imports this module inside its functions, after the stop handlers
are installed: submitit is not imported before they are.

submitit runs `sbatch` itself (SlurmExecutor._submit_command, through its CommandFunction): the
executor here times that call and writes it to hpctrain's Slurm call log (site.slurm_cli.log_call)
with its exit status; it is never retried (a timed-out sbatch may have submitted the job). No other
submitit path that calls Slurm is used: hpctrain follows jobs with its own client (watch/), never
with submitit's sacct watcher or Job.cancel.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit
from submitit.core import job_environment
from submitit.core.utils import DelayedSubmission, FailedJobError, UncompletedJobError
from submitit.slurm.slurm import SlurmExecutor, SlurmJob

from hpctrain.launch.enclosing import left_out_line, outside_job
from hpctrain.site.slurm_cli import log_call

VERSION: str = submitit.__version__  # the pin: pyproject.toml; the task refuses another (launch.task)

# sbatch refused a submission; a job ended without a result (its error: launch.failure)
SUBMIT_ERRORS = (FailedJobError, subprocess.CalledProcessError)
RESULT_ERRORS = (FailedJobError, UncompletedJobError)

# submitit's private names used here → the leading parameters relied on (None: an attribute)
CONTRACT: dict[str, tuple[str, ...] | None] = {
    "submitit.slurm.slurm.SlurmExecutor._make_submission_file_text": ("self", "command", "uid"),
    "submitit.slurm.slurm.SlurmExecutor._make_submission_command": ("self", "submission_file_path"),
    "submitit.slurm.slurm.SlurmExecutor._internal_process_submissions": ("self", "delayed_submissions"),
    "submitit.slurm.slurm.SlurmExecutor._submit_command": ("self", "command"),
    "submitit.slurm.slurm.SlurmJob.__init__": ("self", "folder", "job_id", "tasks"),
    "submitit.core.utils.DelayedSubmission.set_timeout": ("self", "timeout_min", "max_num_timeout"),
    "submitit.core.utils.DelayedSubmission.dump": ("self", "filepath"),
    "submitit.core.utils.JobPaths.move_temporary_file": ("self", "tmp_path", "name"),
    "submitit.core.utils.JobPaths.submitted_pickle": None,
    "submitit.core.job_environment.JobEnvironment._handle_signals": ("self", "paths", "submission"),
    "submitit.core.submission.process_job": ("folder",),
}


@dataclass(frozen=True)
class SlurmSpec:
    """What submitit's Slurm executor needs of a job whose batch script is ours."""

    folder: Path  # the submitit folder: pickles, results, per-task logs
    script: str  # the batch script, written as is (launch.submit.slurm_script)
    nodes: int
    tasks_per_node: int
    time_min: int
    job_name: str
    max_requeues: int
    python: str  # what the script runs the task with (its container block defines it)


class ScriptExecutor(SlurmExecutor):
    """submitit's Slurm executor submitting our batch script in place of its own, with sbatch run
    outside an enclosing job's settings (launch.enclosing)."""

    def __init__(self, spec: SlurmSpec):
        super().__init__(folder=spec.folder, max_num_timeout=spec.max_requeues, python=spec.python)
        self.spec = spec
        self._sbatch_argv: list[str] = ["sbatch"]  # the last submission's command, for the call log
        self.update_parameters(
            nodes=spec.nodes, ntasks_per_node=spec.tasks_per_node, time=spec.time_min, job_name=spec.job_name
        )

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return self.spec.script

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        # its line is said by _submit_command, outside the capture of submitit's stderr
        self._sbatch_argv = outside_job(super()._make_submission_command(submission_file_path), say=False)
        return self._sbatch_argv

    def _submit_command(self, command: str) -> SlurmJob:
        """submitit's submission (its sbatch), logged as one Slurm call: rc 0, sbatch's exit status
        when it refused, None when it did not run to an exit."""
        self._sbatch_argv = ["sbatch"]
        left_out = left_out_line(os.environ)
        if left_out:
            print(left_out, file=sys.stderr)
        t0, rc = time.monotonic(), None
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # its copy of sbatch's stderr: the error carries it
                job = super()._submit_command(command)
            rc = 0
            return job
        except FailedJobError as e:
            cause = e.__cause__
            rc = cause.returncode if isinstance(cause, subprocess.CalledProcessError) else None
            raise
        finally:
            log_call(self._sbatch_argv, time.monotonic() - t0, rc)


class ArrayExecutor(ScriptExecutor):
    """submitit's array submission (one pickle per element, renamed to `<array>_<i>_submitted.pkl`
    after sbatch) with our batch script, which submitit's own array path would replace by its
    default one (the script's `--array` line is ours: launch.sweep.array_plan)."""

    def _internal_process_submissions(self, delayed_submissions: list[DelayedSubmission]) -> list[SlurmJob]:
        folder, pickles = self.spec.folder, []
        for d in delayed_submissions:
            path = folder / f"{uuid.uuid4().hex}.pkl"
            d.set_timeout(self.spec.time_min, self.spec.max_requeues)
            d.dump(path)
            pickles.append(path)
        first = self._submit_command("")  # the script is ours: no command to pass
        jobs = [
            SlurmJob(folder=folder, job_id=f"{first.job_id}_{i}", tasks=list(range(first.num_tasks)))
            for i in range(len(delayed_submissions))
        ]
        for job, path in zip(jobs, pickles):
            job.paths.move_temporary_file(path, "submitted_pickle")
        return jobs


def slurm_job(spec: SlurmSpec, fn: Callable[..., Any], *args: Any) -> submitit.Job:
    """`fn(*args)` as a Slurm job running `spec.script`; SUBMIT_ERRORS when sbatch refuses it."""
    return ScriptExecutor(spec).submit(fn, *args)


def slurm_array(spec: SlurmSpec, fn: Callable[..., Any], args: Sequence[Any]) -> list[submitit.Job]:
    """`fn(a)` for each of `args` as the elements of one Slurm array running `spec.script`."""
    return ArrayExecutor(spec).map_array(fn, args)


def local_job(folder: Path, tasks: int, timeout_min: int, fn: Callable[..., Any], *args: Any) -> submitit.Job:
    """`fn(*args)` as `tasks` processes of submitit's local executor, logs in `folder`."""
    ex = submitit.LocalExecutor(folder=folder)
    ex.update_parameters(tasks_per_node=tasks, nodes=1, timeout_min=timeout_min)
    return ex.submit(fn, *args)


# --------------------------------------------------------------------------- the task's side


def job_env() -> submitit.JobEnvironment:
    """This task's job environment (ranks, hosts, job id, folder)."""
    return submitit.JobEnvironment()


def leave_signals_alone() -> None:
    """submitit's runner installs handlers for the cluster's signals ("@plugin-dev: should be
    adapted"): USR2 → requeue through scontrol (absent in the container), SIGTERM → ignored.
    hpctrain's own (train.stop) are installed first; keep them."""
    job_environment.JobEnvironment._handle_signals = lambda self, paths, submission: None


def submitted_pickle() -> Path:
    """This task's pickled call (SUBMITIT_FOLDER set by the caller, as process_job sets it)."""
    return job_environment.JobEnvironment().paths.submitted_pickle


def run_pickled(folder: str) -> None:
    """Load and run this task's pickled call; write its result file."""
    # the task's runner only: submitit.core.submission imports numpy (absent on login nodes)
    from submitit.core import submission

    submission.process_job(folder)

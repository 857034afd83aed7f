"""The run directory's file and folder names, and the few ways every side reads and writes them.

The task writes the run directory (train), the login node reads it (launch, cli, report): one name
here for each file both sides use, so a rename cannot leave one side looking in the old place.
The batch shell (launch/shell/*.sh, the sbatch template) spells the same names in bash.
"""

from __future__ import annotations

import difflib
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

METRICS = "metrics.jsonl"  # the run's records (run.metrics)
SAMPLE_HASHES = "sample_hashes.jsonl"  # log.sample_hashes: each step's hash of its samples (run.sample_hashes)
CONFIG = "config.yaml"  # the resolved config the task trains
JOB = "job.json"  # which job trains the run: written by `hpctrain submit`, or by rank 0 under plain sbatch
PLAN = "plan.json"  # the plan's prediction at submission: the goodput ledger's plan vs reality (run/goodput.py)
ENV = "env.json"  # this attempt's environment: nodes, versions, the resolved settings
LOCK = ".lock"  # one job at a time (run.rundir)
CHECKPOINTS = "checkpoints"  # step-<n>.pt or step-<n>/ (train.ckpt.checkpoint)
LOGS = "logs"  # a log per rank, the hang watchdog's heartbeats and dumps
SUBMITIT = "submitit"  # submitit's folder: the sbatch script, pickles, Slurm's stdout and stderr
CODE = "code"  # <root>/code/<hash>/hpctrain: the code snapshots (run.source)
CONTROL = ".hpctrain"  # the batch shell's $HPCTRAIN_CONTROL_DIR under the job's working directory
JOB_RECORD = "job-{}.json"  # in CONTROL: the run a Slurm job (by id) trains, for jobs from plain sbatch
RUNS = Path("runs")  # run.dir's default: where a bare run name or a local job id is looked up

T = TypeVar("T")


def atomic_write(path: Path, data: str | bytes | Callable[[IO[bytes]], object], sync: bool = False) -> None:
    """Write `data` (text, bytes, or a function that writes the open binary file: torch.save
    streams a checkpoint) to a temp file in the same directory, then rename it over `path`: a
    reader sees the old file or the new one, never half of one. The temp file is removed when
    the write fails. `sync`: fsync the file before the rename and the directory after it, so the
    new file survives a crash of the node, not only of the process.

    The temp name starts with a dot and carries the host and pid (writers on several nodes of a
    shared file system), and ends in `.tmp`: the checkpoint and watchdog cleanups find what a
    killed writer left (`.<name>.tmp-*`, `*.tmp`)."""
    tmp = path.with_name(f".{path.name}.tmp-{socket.gethostname()}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w" if isinstance(data, str) else "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync:
        fsync_dir(path.parent)


def append_line(path: str | Path, line: str, mode: int = 0o644) -> None:
    """Append one line with a single O_APPEND write: lines that several ranks append to one file
    (the bad-nodes file, the crash file the batch shell reads) never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def fsync_dir(d: Path) -> None:
    """Make a rename in `d` durable (the directory entry, not only the file's data)."""
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_json(path: Path, default: T) -> dict[str, Any] | T:
    """The JSON object in `path`; `default` when the file is missing, unreadable, cut short or
    not an object (a record written by another version, or by a writer that died)."""
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return default
    return rec if isinstance(rec, dict) else default


def slurm_job_run_dir(workdir: Path, job_id: str) -> Path | None:
    """The run a Slurm job trains, from its working directory: that directory itself when
    `hpctrain submit` made it (it holds job.json), else the record rank 0 leaves in the control
    directory (`<workdir>/.hpctrain/job-<id>.json`) for jobs started with plain sbatch."""
    if (workdir / JOB).is_file():
        return workdir
    rec = read_json(workdir / CONTROL / JOB_RECORD.format(job_id), {})
    return Path(rec["run_dir"]) if rec.get("run_dir") and Path(rec["run_dir"]).is_dir() else None


def run_dir_named(target: str) -> Path | None:
    """The run directory `target` names, resolved: a directory holding config.yaml, or a run name
    under ./runs; None when neither is a run."""
    for cand in (Path(target), RUNS / target):
        if (cand / CONFIG).is_file():
            return cand.resolve()
    return None


def near_runs(target: str, n: int = 3) -> list[str]:
    """The run directories whose names are closest to `target`'s (a mistyped run, e.g. runs/digits_vt),
    as `target` spells their folder: among the runs beside it, and under ./runs for a bare name."""
    path = Path(target)
    folders = [path.parent] + ([RUNS] if path.parent == Path(".") else [])
    runs: dict[str, str] = {}
    for folder in folders:
        if not folder.is_dir():
            continue
        for d in sorted(folder.iterdir()):
            if (d / CONFIG).is_file():
                runs.setdefault(d.name, str(d) if folder == path.parent else d.name)
    return [runs[m] for m in difflib.get_close_matches(path.name, list(runs), n=n, cutoff=0.6)]

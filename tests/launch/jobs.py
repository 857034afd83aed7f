"""Helpers for jobs on the session's Slurm test cluster (tests/slurm_cluster.py)."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from hpctrain.train.ckpt import checkpoint as ckpt
from tests.helpers import WAIT_S, digits_args, run_metrics, run_ranks, run_report, tails, wait_for

ROOT = Path(__file__).resolve().parents[2]
metrics = run_metrics
# What the jobs of the stop, requeue and fault tests train: 2 epochs of digits (44 steps at the global
# batch of 64, whatever the world size), a record per step; each test adds its checkpoint interval.
JOB_SETS = ("train.epochs=2", "log.every=1", "train.eval_every_epochs=0")
JOB_STEPS = 44


def uninterrupted(world: int, digits_root: Path, tmp_path_factory) -> dict:
    """The final weights of JOB_SETS trained straight through by `world` local gloo ranks (rank r is
    SLURM_PROCID r of a job: the same global batch, the same shard of each batch, threads pinned):
    what a job of those tests must end with, however often it stopped.

    Trained once per test session for each world size (~15 s a rank), under a lock in the directory
    the xdist workers share: the Slurm 22.05 and 24.11 tests run in different workers."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # …/pytest-N/ (popen-gwK/ below)
    d = shared / f"uninterrupted-{world}"
    with open(shared / f"uninterrupted-{world}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other worker waits for the first one's run
        if not ckpt.list_checkpoints(d / "ref"):
            run_ranks(world, digits_args(digits_root, d, "ref", *JOB_SETS, "ckpt.every=0"))
        return ckpt.load(ckpt.list_checkpoints(d / "ref")[0])["model"]


SUBMITTING = ("submit", "sweep", "eval")  # the commands that refuse a live controller without a profile


def hp(
    cluster,
    *args: str,
    cwd: Path | None = None,
    env: dict | None = None,
    timeout: float = 120,
    as_root: bool = False,
    user=None,
):
    """`hpctrain …` against the test cluster, as a site user types it (tests/site_users.py): the first
    ordinary user by default (or `user`), umask 002, a login shell's clean environment with $SLURM_CONF
    and `env`; its jobs run as that user. `as_root`: as this test process, in its own environment, for
    what only an administrator does. Either way a submission's profile is `local` (CPU nodes, no GPUs
    asked) unless `env` names another ($HPCTRAIN_CLUSTER): one to a controller with no profile named
    is refused (the other commands run without one, as before)."""
    cmd = [sys.executable, "-m", "hpctrain", *args]
    profile = {"HPCTRAIN_CLUSTER": "local"} if args and args[0] in SUBMITTING else {}
    env = {"OMP_NUM_THREADS": "1", **profile, **(env or {})}
    if not as_root and cluster.users is not None:
        return cluster.user_run(cmd, user, env, cwd=cwd, timeout=timeout)
    e = cluster.environ(env)
    if "HPCTRAIN_CLUSTER" not in env:  # this machine's own, if any
        e.pop("HPCTRAIN_CLUSTER", None)
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=e, timeout=timeout)


def digits_sets(root: Path, run_dir: Path, name: str, *extra: str) -> list[str]:
    out = []
    for s in (f"data.root={root}", f"run.dir={run_dir}", f"run.name={name}", "train.threads=1", *extra):
        out += ["--set", s]
    return out


def submit(cluster, *args: str, env: dict | None = None) -> str:
    r = hp(cluster, "submit", "--config", "configs/digits_vit.yaml", *args, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return re.search(r"submitted Slurm job (\d+)", r.stdout).group(1)


def batch_host(cluster, job: str) -> str:
    """The node that runs the job's batch shell: the first of its allocation."""
    nodes = cluster.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()
    return cluster.run("scontrol", "show", "hostnames", nodes).stdout.split()[0]


def sacct_states(cluster, job: str) -> list[str]:
    """Every run of the job, oldest first (REQUEUED … COMPLETED)."""
    r = cluster.run("sacct", "-n", "-X", "-P", "-D", "-j", job, "-o", "State", check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def sbatch_wrap(cluster, partition: str, nodes: int, cmd: str, *extra: str) -> str:
    """The id of an exclusive `sbatch --wrap cmd` job of `nodes` nodes (output to /dev/null)."""
    return cluster.run(
        "sbatch", "--parsable", "-p", partition, f"-N{nodes}", "--exclusive", "-o", "/dev/null", *extra, "--wrap", cmd
    ).stdout.strip()


def wait_running(cluster, job: str, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while cluster.state(job) != "RUNNING":
        assert time.monotonic() < end, f"job {job} did not start: {cluster.state(job)}"
        time.sleep(0.3)


def rank_hosts(run_dir: Path) -> dict[int, tuple[int, str]]:
    """rank → (world size, host) of the latest attempt, from each rank's log (every attempt appends
    its start line)."""
    out = {}
    for log in sorted((run_dir / "logs").glob("rank-*.log")):
        found = re.findall(r"world size (\d+) .* rank (\d+) on host (\S+)", log.read_text())
        if found:
            world, rank, host = found[-1]
            out[int(rank)] = (int(world), host)
    return out


def job_report(cluster, job: str, run_dir: Path) -> str:
    """What a job was doing: Slurm's rows for it, its run's last records and rank logs' tails."""
    squeue = cluster.run("squeue", "-h", "-j", job, "-o", "%i %T %r %N", check=False).stdout.strip()
    sacct = cluster.run(
        "sacct", "-n", "-P", "-D", "-j", job, "-o", "JobID,State,ExitCode,NodeList", check=False
    ).stdout.strip()
    outs = [*Path(run_dir).parent.glob(f"*{job}*.out"), *(Path(run_dir) / "submitit").glob(f"{job}_*_log.*")]
    return f"job {job}: squeue [{squeue}] sacct [{sacct}]\n{run_report(run_dir)}\n{tails(sorted(outs), 25)}"


def wait_for_step(run_dir: Path, step: int, timeout: float = 0) -> int:
    """The run's last train step once it is at `step` or beyond; waits on the records, for at least
    `timeout` s and WAIT_S, and on a miss says what the run was doing."""

    def reached():
        steps = [r["step"] for r in metrics(run_dir, "train")]
        return steps[-1] if steps and steps[-1] >= step else None

    return wait_for(reached, f"{run_dir} did not reach step {step}", max(timeout, WAIT_S), lambda: run_report(run_dir))


def check_run_dir(run_dir: Path, world: int) -> None:
    assert (run_dir / "config.yaml").is_file() and (run_dir / "env.json").is_file()
    assert metrics(run_dir, "end") and metrics(run_dir, "eval")
    assert (run_dir / "checkpoints" / "latest").is_file()
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == [f"rank-{r}.log" for r in range(world)]
    hosts = rank_hosts(run_dir)
    assert sorted(hosts) == list(range(world)) and {w for w, _ in hosts.values()} == {world}
    assert {h for _, h in hosts.values()} == {"n1", "n2"}


def task_pid(job: str, rank: int) -> int | None:
    """The Python process of one task of our job (found by its Slurm environment)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = dict(x.split("=", 1) for x in (d / "environ").read_text().split("\0") if "=" in x)
            argv0 = (d / "cmdline").read_text().split("\0")[0]
        except OSError:
            continue
        if (
            env.get("SLURM_JOB_ID") == job
            and env.get("SLURM_PROCID") == str(rank)
            and "SLURM_STEP_ID" in env
            and Path(argv0).name.startswith("python")
        ):
            return int(d.name)
    return None

"""What a submission costs the site's daemons (issue 55): a first `hpctrain submit` makes at most 6
Slurm calls (6 here: `scontrol ping` first), a dry run and a second submit within the cache's life
(plan.queue: NOW_CACHE_S) at most the sbatch and one (here: none, and `scontrol ping` and the sbatch).
Counted twice, against the real test cluster: by stand-ins for Slurm's clients first on the user's
PATH that count each call and then run the real client, and by hpctrain's own call log
($HPCTRAIN_SLURM_CALL_LOG), which must agree with them (so the log that bench/site_load.py reads
cannot lie)."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from hpctrain.site.slurm_cli import CALL_LOG_VAR, COMMANDS
from tests.helpers import wait_for
from tests.launch.jobs import digits_sets, hp
from tests.site_users import LOGIN_PATH

FIRST_SUBMIT, SECOND_SUBMIT = 6, 2  # the budget


def counting_clients(d: Path) -> Path:
    """`d` with a stand-in for each Slurm client this machine has: it appends its name to d/calls and
    execs the real one (by its absolute path, so the stand-in is not found again)."""
    d.mkdir(mode=0o777)
    d.chmod(0o777)
    (d / "calls").touch(mode=0o666)
    (d / "calls").chmod(0o666)
    for name in COMMANDS:
        real = shutil.which(name, path=LOGIN_PATH)
        if real:
            # the jobs inherit this PATH: their batch shell's calls (SLURM_JOB_ID set) are not the submission's
            (d / name).write_text(
                f'#!/bin/sh\n[ -n "$SLURM_JOB_ID" ] || echo {name} >> "{d}/calls"\nexec {real} "$@"\n'
            )
            (d / name).chmod(0o755)
    return d


def counted(d: Path, since: int) -> Counter:
    return Counter(d.joinpath("calls").read_text().split()[since:])


def logged(log: Path, since: int) -> tuple[Counter, int]:
    """(the login node's calls the log holds from line `since` on, by kind; its cached answers)."""
    lines = [json.loads(x) for x in log.read_text().splitlines()[since:]] if log.exists() else []
    lines = [x for x in lines if x["where"] == "login"]  # not the jobs' own (they inherit the variable)
    return Counter(x["kind"] for x in lines if not x["cached"]), sum(x["cached"] for x in lines)


@pytest.mark.slurm
def test_a_submission_reads_the_queue_once_and_a_second_one_from_the_cache(slurm_cluster, digits_root, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)  # the site user's run directories, cache and log (sticky: theirs alone)
    bin_dir = counting_clients(shared / "bin")
    log = shared / "calls.jsonl"
    env = {
        "PATH": f"{bin_dir}:{LOGIN_PATH}",
        CALL_LOG_VAR: str(log),
        "XDG_CACHE_HOME": str(shared / "cache"),
    }
    jobs, lines, seen = [], [], (0, 0)

    def submit(name: str, *extra: str, command: str = "submit") -> tuple[Counter, Counter, int]:
        nonlocal seen
        sets = digits_sets(digits_root, shared / "runs", name, "train.epochs=1")
        if command == "sweep":  # the sweep names its members' runs
            i = sets.index(f"run.name={name}")
            del sets[i - 1 : i + 1]
        r = hp(slurm_cluster, command, "--config", "configs/digits_vit.yaml", *sets, *extra, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        jobs.extend(re.findall(r"submitted Slurm job (\d+)", r.stdout))
        queue = re.search(r"^(?:hpctrain: )?(queue: .*)$", r.stdout + r.stderr, re.M)
        lines.extend([queue[1]] if queue else [])
        n_counted = len(bin_dir.joinpath("calls").read_text().split())
        n_logged = len(log.read_text().splitlines())
        by_stand_in, (by_log, cached) = counted(bin_dir, seen[0]), logged(log, seen[1])
        seen = (n_counted, n_logged)
        assert by_log == by_stand_in, (by_log, by_stand_in)  # the log holds every call, and only calls
        print(f"{name}: {sum(by_stand_in.values())} Slurm calls {dict(by_stand_in)}, {cached} cached answers")
        return by_stand_in, by_log, cached

    try:
        first, _, _ = submit("first")
        assert sum(first.values()) <= FIRST_SUBMIT, first
        assert first["sbatch"] == 1 and first["sacct"] == 1, first  # one bounded history scan
        dry, _, dry_cached = submit("dry", "--dry-run")
        assert sum(dry.values()) <= SECOND_SUBMIT - 1 and dry_cached >= 3, dry  # the same context, shared
        second, _, cached = submit("second")
        assert sum(second.values()) <= SECOND_SUBMIT and second["sbatch"] == 1, second
        assert cached >= 3  # sacct, sinfo, squeue answered from the cache
        # a sweep's members are prepared as single runs: the partition's answers, shared too
        sweep, _, _ = submit("sweep", "--grid", "optim.lr=1e-3,5e-4", "--name", "sw", "--dry-run", command="sweep")
        assert sum(sweep.values()) <= SECOND_SUBMIT - 1, sweep
        assert lines[0] == lines[1] == lines[2], lines  # the same figures, from the same answers
        # ckpt.every=auto reads a month of sacct for the partition's MTBF: the queue's week is read from
        # that one scan (an empty cache: a first submission of such a job)
        env["XDG_CACHE_HOME"] = str(shared / "cache-auto")
        auto, _, _ = submit("auto", "--set", "ckpt.every=auto", "--dry-run")
        assert auto["sacct"] == 1 and sum(auto.values()) <= FIRST_SUBMIT - 1, auto
    finally:
        for job in jobs:
            slurm_cluster.run("scancel", job, check=False)
        # gone before the next test: a job still completing when a later test restarts or reconfigures the
        # controller may never confirm its end, and Slurm drains its node ("Kill task failed")
        for job in jobs:
            slurm_cluster.wait_done(job, 120)
        if jobs:
            queue = ("squeue", "-h", "-j", ",".join(jobs))
            wait_for(
                lambda: not slurm_cluster.run(*queue, check=False).stdout.strip(), "the cancelled jobs to end", 120
            )

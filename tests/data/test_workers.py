"""`data.workers: auto` (data/workers.py): the task's CPUs less one for the rank, at most AUTO_MAX;
an integer, as old files have it, is used as given."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hpctrain.config import ConfigError, load
from hpctrain.data.workers import AUTO_MAX, auto_workers, resolve_workers, task_cpus
from tests.helpers import ROOT

DIGITS = ROOT / "configs" / "digits_vit.yaml"


@pytest.mark.parametrize(
    ("environ", "affinity", "cpus"),
    [
        ({"SLURM_CPUS_PER_TASK": "12"}, 96, 12),  # unbound task (task/none): its share, not the node
        ({"SLURM_CPUS_PER_TASK": "12"}, 4, 4),  # never more than it may run on
        ({"SLURM_CPU_BIND_TYPE": "mask_cpu:"}, 6, 6),  # srun bound it: the affinity is its own
        ({"SLURM_CPU_BIND_TYPE": "none", "LOCAL_WORLD_SIZE": "8"}, 96, 12),  # shared by the node's ranks
        ({"SLURM_NTASKS_PER_NODE": "2"}, 2, 1),  # a batch script's srun, no torchrun/launch.task
        ({"LOCAL_WORLD_SIZE": "8"}, 4, 1),  # fewer CPUs than ranks: still one
        ({}, 3, 3),  # one process alone
    ],
)
def test_task_cpus(environ, affinity, cpus):
    assert task_cpus(environ, affinity)[0] == cpus


def test_auto_leaves_one_cpu_for_the_rank_and_is_capped():
    assert [auto_workers(c) for c in (1, 2, 4, 12, 96)] == [0, 1, 3, AUTO_MAX, AUTO_MAX]
    assert resolve_workers("auto", {"SLURM_CPUS_PER_TASK": "1"})[0] == 0  # Slurm's default: one CPU per task


def test_an_integer_is_used_as_given_whatever_the_cpus():
    assert resolve_workers(4, {"SLURM_CPUS_PER_TASK": "1"}) == (4, "data.workers=4")


def test_auto_reads_the_processes_real_cpu_affinity():
    """What a task bound to one core sees (srun --cpu-bind, or taskset): os.sched_getaffinity."""
    code = (
        "import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
        "from hpctrain.data.workers import resolve_workers; print(resolve_workers('auto', {})[0])"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM") and k != "LOCAL_WORLD_SIZE"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.stdout.strip() == "0", r.stderr


def test_config_default_is_auto_and_old_integer_files_load():
    assert load(None).data.workers == "auto"
    assert load(DIGITS).data.workers == 0  # the file says 0
    assert load(DIGITS, ["data.workers=6"]).data.workers == 6


def test_other_words_are_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        load(DIGITS, ["data.workers=many"])
    assert str(e.value) == (
        "data.workers='many' is not allowed: use a number of loader workers per rank (0: load in the rank's own "
        "process) or auto (from the task's CPUs)"
    )

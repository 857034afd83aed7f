"""Submitting from inside a job (`salloc`, an `hpctrain notebook` terminal, a job that chains the
next): the environment sbatch gets.

sbatch copies its whole environment into the new job (--export=ALL, the default), so the enclosing
job's SLURM_MEM_PER_CPU, SLURM_CPUS_PER_TASK, SLURM_STEP_*, … reach the new job's srun,
which then fails ("SLURM_MEM_PER_CPU, SLURM_MEM_PER_GPU, and SLURM_MEM_PER_NODE are mutually
exclusive") or runs with the old job's shape (measured on Slurm 22.05: docs/sites.md). Inside a
job (SLURM_JOB_ID set) every `sbatch` hpctrain runs leaves out the SLURM_* variables but the
client settings in KEEP, and SRUN_* (batch scripts, ours too, export SRUN_CPUS_PER_TASK); SBATCH_*
stay: Slurm never sets them, so they are the user's or the site's on purpose.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

# Client settings, not properties of the enclosing job: which slurm.conf / cluster to talk to,
# how to print times, the token of auth/jwt sites.
KEEP = ("SLURM_CONF", "SLURM_CLUSTERS", "SLURM_TIME_FORMAT", "SLURM_JWT")


def enclosing_settings(environ: Mapping[str, str]) -> list[str]:
    """The names an enclosing job set that must not reach a new submission (sorted); [] outside a job."""
    if not environ.get("SLURM_JOB_ID"):
        return []
    return sorted(k for k in environ if (k.startswith("SLURM_") and k not in KEEP) or k.startswith("SRUN_"))


def left_out_line(environ: Mapping[str, str]) -> str | None:
    """The line that says which of the enclosing job's settings a submission leaves out and which it
    keeps; None outside a job."""
    drop = enclosing_settings(environ)
    if not drop:
        return None
    kept = sorted(k for k in environ if k in KEEP or k.startswith("SBATCH_"))
    return (
        f"hpctrain: submitting from inside Slurm job {environ['SLURM_JOB_ID']}: its {len(drop)} job "
        f"settings stay out of the new job ({', '.join(drop)}); kept: {', '.join(kept) or 'none'}"
    )


def outside_job(argv: list[str], environ: Mapping[str, str] | None = None, say: bool = True) -> list[str]:
    """`argv` (an sbatch command) run without the enclosing job's settings: `env -u NAME … argv`,
    with `left_out_line` on stderr unless `say` is False (a caller that prints it itself, outside a
    capture of stderr). Unchanged outside a job."""
    environ = os.environ if environ is None else environ
    drop = enclosing_settings(environ)
    if not drop:
        return list(argv)
    if say:
        print(left_out_line(environ), file=sys.stderr)
    return ["env", *[a for k in drop for a in ("-u", k)], *argv]

"""The batch script: one renderer for `hpctrain submit` (through submitit), `--dry-run` and the
committed stand-alone `slurm/vit.sbatch`, so the three never drift apart.

Every value from a config or profile is passed through `shlex.quote` (or, for `#SBATCH` lines,
refused when it could end the line); the script's knobs (`CONTAINER`, `HPCTRAIN_IMAGE`,
`HPCTRAIN_MODULES`, `HPCTRAIN_CONFIG`, `HPCTRAIN_SET`) can be overridden from the environment.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from hpctrain.config import control_char, encode_overrides
from hpctrain.launch.container import PY_VAR, python_lines
from hpctrain.launch.modules import module_lines
from hpctrain.launch.nccl import export_lines, fabric_env
from hpctrain.launch.profile import ClusterProfile


@dataclass(frozen=True)
class JobPlan:
    """Everything the batch script needs; made by launch.submit.plan_job (no torch imported)."""

    profile: ClusterProfile
    job_name: str
    nodes: int
    tasks_per_node: int
    gpus_per_node: int  # requested from Slurm (0: none, e.g. CPU test clusters)
    cpus_per_task: int  # 0: let Slurm decide
    mem: str
    time: str
    partition: str = ""
    account: str = ""
    qos: str = ""
    constraint: str = ""
    exclusive: bool = False
    output: str = ""  # #SBATCH --output (batch shell's own log)
    chdir: str = ""
    binds: list[str] = field(default_factory=list)
    config: str = ""  # HPCTRAIN_CONFIG default of the stand-alone script
    overrides: list[str] = field(default_factory=list)  # HPCTRAIN_SET default (stand-alone)
    header: list[str] = field(default_factory=list)  # comment lines under the shebang

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node


def sbatch_value(key: str, value: object) -> str:
    """`#SBATCH --key=value`; Slurm reads these lines itself (no shell), so only refuse control
    characters (a newline ends the line). Config, profile and CLI values are checked before this
    (config.check_text): reaching it is a bug, not a user error."""
    s = str(value)
    if control_char(s):
        raise ValueError(f"--{key}: value {s!r} contains a control character")
    return f"#SBATCH --{key}={shlex.quote(s)}" if s != "" else f"#SBATCH --{key}"


def sbatch_lines(p: JobPlan) -> list[str]:
    opts: list[tuple[str, object]] = [("job-name", p.job_name), ("nodes", p.nodes),
                                      ("ntasks-per-node", p.tasks_per_node)]
    if p.gpus_per_node:
        opts.append(("gpus-per-node", p.gpus_per_node))
    if p.cpus_per_task:
        opts.append(("cpus-per-task", p.cpus_per_task))
    opts += [("mem", p.mem), ("time", p.time)]
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(p, key):
            opts.append((key, getattr(p, key)))
    if p.exclusive:
        opts.append(("exclusive", ""))
    requeue = "requeue" if p.profile.slurm.max_requeues > 0 else "no-requeue"  # node failures too
    opts += [("signal", f"USR2@{p.profile.slurm.signal_lead_s}"), (requeue, ""), ("open-mode", "append")]
    if p.output:
        opts.append(("output", p.output))
    if p.chdir:
        opts.append(("chdir", p.chdir))
    return [sbatch_value(k, v) for k, v in opts]


def render(p: JobPlan, command: str, host_python: str, standalone: bool,
           extra_env: dict[str, str] | None = None) -> str:
    """The whole script; `command` is what follows `srun --kill-on-bad-exit=1 --unbuffered`."""
    q = shlex.quote
    prof = p.profile
    lines = ["#!/bin/bash", *[f"# {h}".rstrip() for h in p.header], *sbatch_lines(p), "",
             "set -eo pipefail", ""]
    if standalone:
        lines += ["# What to train: a config file and ';'-separated key=value overrides (the environment",
                  "# wins).",
                  f"HPCTRAIN_CONFIG=${{HPCTRAIN_CONFIG-{q(p.config)}}}",
                  f"HPCTRAIN_SET=${{HPCTRAIN_SET-{q(encode_overrides(p.overrides))}}}",
                  "export HPCTRAIN_CONFIG HPCTRAIN_SET", ""]
    mods = module_lines(prof.modules, prof.module_use)
    if mods:
        lines += ["# Site modules (HPCTRAIN_MODULES= empty skips them).", *mods, ""]
    lines += [f"# Fabric: {prof.fabric.kind}, and the profile's env. A variable already set in the",
              "# job's environment wins (e.g. NCCL_DEBUG=INFO sbatch ...).",
              *export_lines(fabric_env(prof), env_wins=True),
              f"export HPCTRAIN_MAX_REQUEUES={prof.slurm.max_requeues}",
              *export_lines(extra_env or {}), ""]
    lines += ["# Python for every task: CONTAINER=apptainer|none, HPCTRAIN_IMAGE=<image.sif>.",
              *python_lines(prof.container, p.binds, host_python), ""]
    lines += ["# Slurm >= 22.05: srun no longer inherits --cpus-per-task from the allocation.",
              'if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then',
              "  export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK", "fi", ""]
    lines += ['echo "hpctrain: job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT:-0}) on '
              '${SLURM_JOB_NODELIST:-?}: ${SLURM_NNODES:-?} nodes x ${SLURM_NTASKS_PER_NODE:-?} tasks; '
              'modules: ${LOADEDMODULES:-none}; python: ${' + PY_VAR + '[*]}"', ""]
    lines += ["# One task per GPU. A task that dies ends the whole step (no hang); USR2 reaches every",
              "# task, which checkpoints at the next step and lets rank 0 requeue the job.",
              f"srun --kill-on-bad-exit=1 --unbuffered {command}",
              ""]
    return "\n".join(lines)

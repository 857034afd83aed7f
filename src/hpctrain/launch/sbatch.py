"""The batch script: one renderer for `hpctrain submit` (through submitit), `--dry-run` and the
committed stand-alone `slurm/vit.sbatch`, so the three never drift apart.

Every value from a config or profile is passed through `shlex.quote` (or, for `#SBATCH` lines,
refused when it could end the line). The stand-alone script's knobs (`CONTAINER`, `HPCTRAIN_IMAGE`,
`HPCTRAIN_SOURCE`, `HPCTRAIN_MODULES`, `HPCTRAIN_CONFIG`, `HPCTRAIN_SET`, the fabric's `NCCL_*`) can be
overridden from the environment; a script `hpctrain submit` hands to sbatch fixes the code, the image,
the runtime and the fabric at submission (a variable left in the submitting shell changes none of them).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hpctrain import shellfile
from hpctrain.ckpt_interval import MTBF_SOURCE_ENV
from hpctrain.config import control_char, encode_overrides
from hpctrain.errors import LaunchError
from hpctrain.launch import inplace, stage_image
from hpctrain.launch.container import python_lines
from hpctrain.launch.modules import job_module_lines
from hpctrain.site.fabric import export_lines, fabric_env, left_to_nccl
from hpctrain.site.profile import ClusterProfile
from hpctrain.site.runtimes.base import SRUN_VAR


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
    stage_to: str = ""  # data.stage_to: a node-local dir bound per node at run time (sif.cleanenv_wrapper)
    config: str = ""  # HPCTRAIN_CONFIG default of the stand-alone script
    overrides: list[str] = field(default_factory=list)  # HPCTRAIN_SET default (stand-alone)
    header: list[str] = field(default_factory=list)  # comment lines under the shebang
    array: str = ""  # #SBATCH --array (a sweep: 0-(n-1)%K), empty for one run
    workdirs: list[str] = field(default_factory=list)  # a sweep: element i's run directory
    spare_nodes: int = 0  # hot spares: allocated beside `nodes` (--no-kill), idle until a node fails
    min_nodes: int = 0  # a node range: Slurm gives min_nodes..nodes (--no-kill), trained on as given; 0: `nodes`
    nsys_ranks: list[int] = field(default_factory=list)  # --nsys-ranks: these tasks run under nsys
    nsys_dir: str = ""  # where their reports go (<run>/profile)
    mtbf_source: str = ""  # where ckpt.mtbf_h came from (ckpt.every=auto): exported for env.json
    mtbf_scan_days: float = 0  # the sacct window read for that MTBF (0: none), which the queue's week reuses

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

    @property
    def ranged(self) -> bool:
        """A node range (docs/launch.md, "Node ranges and fewer nodes"): fewer nodes than asked are fine."""
        return 0 < self.min_nodes < self.nodes

    @property
    def no_kill(self) -> bool:
        """#SBATCH --no-kill: a failed node leaves the job instead of ending it (spares take its place, or
        a ranged job goes on with fewer nodes: launch.inplace)."""
        return bool(self.spare_nodes) or self.ranged

    @property
    def nodes_text(self) -> str:
        """The training nodes as the user asked: `16`, or `12-16` for a range (spares aside)."""
        return f"{self.min_nodes}-{self.nodes}" if self.ranged else str(self.nodes)

    def nodes_value(self) -> str:
        """#SBATCH --nodes: N, or MIN-MAX for a range (spares added to both ends)."""
        hi = self.nodes + self.spare_nodes
        return f"{self.min_nodes + self.spare_nodes}-{hi}" if self.ranged else str(hi)


# The call log of every Slurm call (site/slurm_cli.py on the login node, ctld.sh's hpctrain_slurm in the
# batch shell): one file, named by this variable, read by bench/site_load.py.
CALL_LOG_VAR = "HPCTRAIN_SLURM_CALL_LOG"


def call_log_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The submitting shell's call log, fixed in a submitted script as an absolute path: the batch shell
    logs to the same file even where sbatch exports no environment or runs elsewhere than the submission."""
    path = environ.get(CALL_LOG_VAR, "")
    if not path:
        return {}
    if control_char(path):
        raise LaunchError(f"{CALL_LOG_VAR}={path!r} holds a control character: name a plain file path, or unset it")
    return {CALL_LOG_VAR: os.path.abspath(path)}


def sbatch_value(key: str, value: object) -> str:
    """`#SBATCH --key=value`; Slurm reads these lines itself (no shell), so only refuse control
    characters (a newline ends the line). Config, profile and CLI values are checked before this
    (config.check_text): reaching it is a bug, not a user error."""
    s = str(value)
    if control_char(s):
        raise ValueError(f"--{key}: value {s!r} contains a control character")
    return f"#SBATCH --{key}={shlex.quote(s)}" if s != "" else f"#SBATCH --{key}"


def sbatch_lines(p: JobPlan) -> list[str]:
    opts: list[tuple[str, object]] = [
        ("job-name", p.job_name),
        ("nodes", p.nodes_value()),
        # A range asks each node for its tasks' CPUs instead: Slurm 22.05 takes --ntasks-per-node with a
        # range as MIN × that many tasks and then gives at most that many nodes (measured, docs/launch.md)
        ("mincpus", p.tasks_per_node * max(p.cpus_per_task, 1)) if p.ranged else ("ntasks-per-node", p.tasks_per_node),
    ]
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
    if p.array:
        opts.append(("array", p.array))
    if p.no_kill:  # a failed node leaves the job instead of ending it (launch.inplace)
        opts.append(("no-kill", ""))
    requeue = "requeue" if p.profile.slurm.max_requeues > 0 else "no-requeue"  # node failures too
    # B: the batch shell takes the USR2 and passes it on (stop_lines): it alone can tell a time limit
    # from a preemption that Slurm announces with the same signal (preempt_send_user_signal)
    opts += [("signal", f"B:USR2@{p.profile.slurm.signal_lead_s}"), (requeue, ""), ("open-mode", "append")]
    if p.output:
        opts.append(("output", p.output))
    if p.chdir:
        opts.append(("chdir", p.chdir))
    return [sbatch_value(k, v) for k, v in opts]


def stop_lines() -> list[str]:
    """Signals and the stop file: what the tasks and this shell agree on before srun starts; the
    shell's long commands, waited for so that a trap acts at once (signals.sh); its calls to slurmctld
    (ctld.sh: retried through a controller restart or stall); the progress ledger (progress.sh) and the
    time limit's clock (clock.sh)."""
    return [
        *shellfile.lines("stops.sh"),
        *shellfile.lines("signals.sh"),
        *shellfile.lines("slurm_call.sh"),
        *shellfile.lines("ctld.sh"),
        *shellfile.lines("progress.sh"),
        *shellfile.lines("clock.sh"),
    ]


# Slurm applies the submitting shell's soft limits to the job (slurm.conf(5), PropagateResourceLimits:
# all by default): a login node's `ulimit -l` (often 64 KiB) is too little for RDMA, which locks its buffers.
MEMLOCK_LINES = shellfile.lines("memlock.sh")


def binding(p: JobPlan) -> list[str]:
    """srun options (words, unquoted) that place the training tasks (docs/sites.md, "CPU and GPU binding"): each task
    on cores of its own when it asks a share (--cpus-per-task), else the site's default binding;
    every task sees all of its node's GPUs and takes cuda:<local rank> (train/entry.py), whatever
    a site's SLURM_GPU_BIND says."""
    opts = []
    if p.cpus_per_task and p.profile.slurm.cpu_bind:
        opts.append(f"--cpu-bind={p.profile.slurm.cpu_bind}")
    if p.gpus_per_node:
        opts.append("--gpu-bind=none")
    return opts


# The training step's srun as step_loop.sh starts it, before its binding (`binding`) and command: the
# short dry run shows it (tests/launch/test_shell_files.py checks that the file has it)
STEP_SRUN = "srun --kill-on-bad-exit=1 --unbuffered --open-mode=append"


def step_lines() -> list[str]:
    """The steps and what follows them, as functions: step_loop.sh and the step_*.sh it calls, and
    requeue.sh after it. Each step starts through hpctrain_slurm (slurm_call.sh), like every call of
    this shell to Slurm."""
    return [
        *shellfile.lines("step_start.sh"),
        *shellfile.lines("step_wait.sh"),
        *shellfile.lines("step_next.sh"),
        *shellfile.lines("step_loop.sh"),
        *shellfile.lines("requeue.sh"),
    ]


def main_lines(parts: Sequence[str], command: str, bind: Sequence[str] = ()) -> list[str]:
    """The job's main, after every definition: the setup of each part that `parts` (the script's lines
    so far) define, in their order, then the steps with this job's srun binding and the tasks'
    `command` (shell words: what follows srun's options), then the requeue or the end."""
    return [
        "# The job: each part's setup in the order of the parts above, the steps, then requeue or end",
        *shellfile.setup_calls(parts),
        shellfile.array("hpctrain_step_bind", bind) if bind else "hpctrain_step_bind=()",
        f"hpctrain_step_loop {command}",
        "hpctrain_requeue_or_end",
    ]


def render(
    p: JobPlan,
    command: str,
    host_python: str,
    standalone: bool,
    extra_env: dict[str, str] | None = None,
    source: str = "''",
) -> str:
    """The whole script; `command` is what follows `srun --kill-on-bad-exit=1 --unbuffered`;
    `source` (a shell word) is the hpctrain package the tasks bind into the image."""
    q = shlex.quote
    prof = p.profile
    lines = ["#!/bin/bash", *[f"# {h}".rstrip() for h in p.header], *sbatch_lines(p), "", "set -eo pipefail", ""]
    if standalone:  # before any default: which settings came from the environment (overrides.sh)
        lines += [*shellfile.lines("overrides.sh"), ""]
    if p.workdirs:  # before the stop file, which lives under $PWD/.hpctrain
        lines += [
            "# Job array: element i trains run i in its own directory; it has its own job id",
            "# ($SLURM_JOB_ID), so its own stop file, requeue (of <array>_<i>) and restart count.",
            shellfile.array("hpctrain_runs", p.workdirs),
            *shellfile.lines("array_run.sh"),
            "",
        ]
    if standalone:
        lines += [
            "# What to train: a config file and key=value overrides, a JSON list or one per line (the",
            "# environment wins).",
            shellfile.default("HPCTRAIN_CONFIG", p.config),
            shellfile.default("HPCTRAIN_SET", encode_overrides(p.overrides)),
            "export HPCTRAIN_CONFIG HPCTRAIN_SET",
            "",
        ]
    lines += [
        "# Python for every task: CONTAINER=apptainer|singularity|pyxis|none, HPCTRAIN_IMAGE=<image.sif, or",
        "# .sqsh/URI for pyxis>, HPCTRAIN_SOURCE= the hpctrain package the tasks run, bound into the image",
        f"# or first on PYTHONPATH (empty: the one the tasks' Python finds). pyxis: srun's {SRUN_VAR} options.",
        *(
            ["# The environment's CONTAINER, HPCTRAIN_IMAGE, HPCTRAIN_SOURCE win over these defaults."]
            if standalone
            else ["# Fixed at submission: the submitting shell's CONTAINER, HPCTRAIN_IMAGE, HPCTRAIN_SOURCE: ignored."]
        ),
        *python_lines(
            prof.container, p.binds, host_python, source, p.stage_to, p.nsys_ranks, p.nsys_dir, env_hooks=standalone
        ),
        "",
    ]
    mods = job_module_lines(prof.modules, prof.container_modules, prof.module_use, prof.module_purge)
    if mods:
        lines += [
            "# Site modules: HPCTRAIN_MODULES for the host's Python, HPCTRAIN_CONTAINER_MODULES in the",
            "# image (empty skips them).",
            *mods,
            "",
        ]
    lines += [
        *(
            [
                f"# Fabric: {prof.fabric.kind}, and the profile's env. A variable already set in the",
                "# job's environment wins (e.g. NCCL_SOCKET_IFNAME=ib0 sbatch ...).",
            ]
            if standalone
            else [
                f"# Fabric: {prof.fabric.kind}, and the profile's env, fixed at submission (per job: --cluster-set",
                "# fabric.nccl_debug=INFO); a variable not set below passes from the submitting shell.",
            ]
        ),
        *left_to_nccl(prof),
        *export_lines(fabric_env(prof), env_wins=standalone),
        f"export HPCTRAIN_FABRIC={q(prof.fabric.kind)}  # health.preflight's all-reduce figure",
        f"export HPCTRAIN_MAX_REQUEUES={prof.slurm.max_requeues}",
        f"export HPCTRAIN_SIGNAL_LEAD_S={prof.slurm.signal_lead_s}  # the tasks' own clock (train.stop)",
        f"export HPCTRAIN_MAX_PREEMPTIONS={prof.slurm.max_preemptions}",
        *([f"export {MTBF_SOURCE_ENV}={q(p.mtbf_source)}  # where ckpt.mtbf_h came from"] if p.mtbf_source else []),
        *export_lines(extra_env or {}),
        "",
    ]
    lines += [*shellfile.lines("srun_env.sh"), *shellfile.lines("memlock.sh"), ""]
    lines += [*stop_lines(), ""]
    lines += inplace.setup_lines(
        p.spare_nodes,
        p.tasks_per_node,
        p.profile.slurm.max_restarts,
        p.profile.slurm.report_bad_node,
        p.min_nodes if p.ranged else 0,
    )
    lines += ["", *shellfile.lines("banner.sh")]  # after setup_lines: it prints hpctrain_tpn
    if not p.no_kill:  # no #SBATCH --no-kill: HPCTRAIN_SPARE_NODES cannot turn spares on (no_kill.sh)
        lines += ["", *shellfile.lines("no_kill.sh")]
    if prof.container.stage_image:
        c = prof.container
        lines += ["", *stage_image.batch_lines(c), ""]
    lines += [
        *inplace.guard_lines(),
        "",
        "# One task per GPU. A task that dies ends the whole step (no hang). srun runs in the",
        "# background so that this shell can take signals while it waits; a step that failed on",
        "# nodes it named runs again without them (launch.inplace).",
        *step_lines(),
        "",
    ]
    lines += [*main_lines(lines, command, binding(p)), ""]
    return "\n".join(lines)

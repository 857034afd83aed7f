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
from hpctrain.launch import inplace, stage_image
from hpctrain.launch.container import PY_VAR, SRUN_VAR, python_lines
from hpctrain.site.fabric import export_lines, fabric_env, left_to_nccl
from hpctrain.site.modules import job_module_lines
from hpctrain.site.profile import ClusterProfile


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
    stage_to: str = ""  # data.stage_to: a node-local dir bound per node at run time (container.cleanenv_wrapper)
    config: str = ""  # HPCTRAIN_CONFIG default of the stand-alone script
    overrides: list[str] = field(default_factory=list)  # HPCTRAIN_SET default (stand-alone)
    header: list[str] = field(default_factory=list)  # comment lines under the shebang
    array: str = ""  # #SBATCH --array (a sweep: 0-(n-1)%K), empty for one run
    workdirs: list[str] = field(default_factory=list)  # a sweep: element i's run directory
    spare_nodes: int = 0  # hot spares: allocated beside `nodes` (--no-kill), idle until a node fails
    nsys_ranks: list[int] = field(default_factory=list)  # --nsys-ranks: these tasks run under nsys
    nsys_dir: str = ""  # where their reports go (<run>/profile)

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
    opts: list[tuple[str, object]] = [("job-name", p.job_name), ("nodes", p.nodes + p.spare_nodes),
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
    if p.array:
        opts.append(("array", p.array))
    if p.spare_nodes:  # a failed node leaves the job instead of ending it (launch.inplace)
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
    """Signals and the stop file: what the tasks and this shell agree on before srun starts."""
    return [
        "# Stops. The tasks checkpoint at the next step on USR2 (--signal, before the time limit) and",
        "# on SIGTERM (preemption); rank 0 then writes `requeue` or `end` (and why) to $HPCTRAIN_STOP_FILE",
        "# and this shell, outside any container, runs `scontrol requeue`: the task's Python never needs",
        "# a Slurm client. USR2 or TERM sent to this shell (--signal=B:USR2, scancel --batch/--full) is",
        "# passed to the tasks as USR2 (srun itself would turn a TERM into SIGKILL for them); a USR2 that",
        "# announces a preemption (PreemptTime set: a site with preempt_send_user_signal) as SIGTERM, so",
        "# that the tasks count it as one (slurm.max_preemptions), not as a time limit.",
        'export HPCTRAIN_CONTROL_DIR="$PWD/.hpctrain"',
        'export HPCTRAIN_STOP_FILE="$HPCTRAIN_CONTROL_DIR/stop-${SLURM_JOB_ID:-none}"',
        'mkdir -p "$HPCTRAIN_CONTROL_DIR" || { echo "hpctrain: cannot create $HPCTRAIN_CONTROL_DIR: run the job '
        'from a writable directory" >&2; exit 1; }',
        'rm -f "$HPCTRAIN_STOP_FILE"',
        "# This job for scontrol: an array element by <array>_<index>, since the element whose own id is the",
        "# array's id would otherwise name (and requeue) the whole array.",
        'hpctrain_job=${SLURM_JOB_ID:-none}',
        'if [ -n "${SLURM_ARRAY_JOB_ID:-}" ]; then hpctrain_job=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}; fi',
        'hpctrain_signal="" hpctrain_srun=""',
        "hpctrain_job_field() {  # one field of `scontrol show job` (empty when unknown)",
        '  scontrol show job -o "$hpctrain_job" 2>/dev/null | tr " " "\\n" | sed -n "s/^$1=//p" | head -n 1',
        "}",
        "hpctrain_preempted() {  # Slurm has picked this job for preemption (PreemptTime is set)",
        '  local t; t=$(hpctrain_job_field PreemptTime); [ -n "$t" ] && [ "$t" != None ]',
        "}",
        "# Slurm >= 24.05 requeues a preempted --requeue job itself when its batch shell ends inside the",
        "# GraceTime under PreemptMode=REQUEUE; a `scontrol requeue` of ours then would leave Slurm's",
        "# preemption mark on the job, and its next run, even a finished one, would be requeued again",
        "# (PREEMPTED): leave that requeue to Slurm (docs/slurm-versions.md).",
        "hpctrain_slurm_requeues_preempted() {",
        '  local v major minor; v=$(scontrol --version 2>/dev/null) || return 1; v=${v##* }',
        '  major=${v%%.*} minor=${v#*.}; minor=${minor%%.*}',
        '  { [ "$major" -gt 24 ] || { [ "$major" = 24 ] && [ "$minor" -ge 5 ]; }; } 2>/dev/null || return 1',
        '  [ "$(hpctrain_job_field Requeue)" = 1 ] || return 1',
        '  scontrol show partition -o "${SLURM_JOB_PARTITION:-}" 2>/dev/null | tr " " "\\n" |',
        '    grep -q "^PreemptMode=.*REQUEUE"',
        "}",
        "hpctrain_pass() {",
        '  hpctrain_signal=$1',
        '  if [ "$1" = USR2 ] && [ -n "$hpctrain_srun" ] && hpctrain_preempted; then',
        '    echo "hpctrain: batch shell received SIGUSR2 at $(date +%T) for a preemption (PreemptTime set): the '
        'tasks get SIGTERM and checkpoint at the next step" >&2',
        '    scancel --signal=TERM "$hpctrain_job" && return',
        "  fi",
        '  echo "hpctrain: batch shell received SIG$1 at $(date +%T): the tasks checkpoint at the next step" >&2',
        '  if [ -n "$hpctrain_srun" ]; then kill -USR2 "$hpctrain_srun" 2>/dev/null || true; fi',
        "}",
        "trap 'hpctrain_pass USR2' USR2",
        "trap 'hpctrain_pass TERM' TERM",
    ]


# Slurm applies the submitting shell's soft limits to the job (slurm.conf(5), PropagateResourceLimits:
# all by default): a login node's `ulimit -l` (often 64 KiB) is too little for RDMA, which locks its buffers.
MEMLOCK_LINES = [
    "# Locked memory: the login shell's soft limit came with the job (PropagateResourceLimits); NCCL over",
    "# InfiniBand/RoCE locks its buffers: raise it as far as this node's hard limit allows.",
    'ulimit -S -l unlimited 2>/dev/null || ulimit -S -l "$(ulimit -H -l)" 2>/dev/null || true',
]

# After srun: wait through trapped signals, then read rank 0's decision.
WAIT_LINES = [
    "hpctrain_srun=$!",
    'while wait "$hpctrain_srun"; hpctrain_rc=$?; kill -0 "$hpctrain_srun" 2>/dev/null; do :; done',
    'wait "$hpctrain_srun" 2>/dev/null; hpctrain_w=$?; [ "$hpctrain_w" = 127 ] || hpctrain_rc=$hpctrain_w',
    'hpctrain_decision="" hpctrain_why=""',
    'if [ -f "$HPCTRAIN_STOP_FILE" ]; then',
    '  { read -r hpctrain_decision; read -r hpctrain_why; } < "$HPCTRAIN_STOP_FILE" || true',
    'elif [ "$hpctrain_rc" != 0 ] && { [ -n "$hpctrain_signal" ] || hpctrain_preempted; }; then',
    "  hpctrain_decision=requeue",
    '  hpctrain_why="the tasks ended (exit $hpctrain_rc) after a stop signal before their own checkpoint: '
    'resuming from the last one"',
    "fi",
]

# After the last step: carry out the decision.
REQUEUE_LINES = [
    'case "$hpctrain_decision" in',
    "  requeue)",
    "    trap '' USR2 TERM  # scontrol requeue ends this shell with SIGTERM",
    '    hpctrain_state=$(hpctrain_job_field JobState) hpctrain_restarts=$(hpctrain_job_field Restarts)',
    "    # only this attempt's own allocation: a job Slurm requeued already (same id, a later restart) is not ours",
    '    if [ "$hpctrain_state" != RUNNING ] || [ "${hpctrain_restarts:-0}" != "${SLURM_RESTART_COUNT:-0}" ]; then',
    '      echo "hpctrain: job ${hpctrain_job} is ${hpctrain_state:-gone} (restart ${hpctrain_restarts:-?}) already: '
    'Slurm requeues or ends it itself"',
    "      exit 0",
    "    fi",
    '    echo "hpctrain: $hpctrain_why"',
    "    if hpctrain_preempted && hpctrain_slurm_requeues_preempted; then",
    '      echo "hpctrain: preempted under PreemptMode=REQUEUE: Slurm $(scontrol --version | sed \'s/.* //\') requeues '
    'the job itself as this shell ends"',
    "      exit 0",
    "    fi",
    '    if [ -n "${hpctrain_bad// /}" ]; then hpctrain_requeue_excluding && exit 0',
    '    else scontrol requeue "$hpctrain_job" && exit 0',
    "    fi",
    '    echo "hpctrain: scontrol requeue $hpctrain_job failed; the checkpoint is saved: resubmit the same job '
    'to resume" >&2',
    "    exit 1 ;;",
    "  end)",
    '    echo "hpctrain: stopped and not requeued: $hpctrain_why" >&2',
    "    exit 3 ;;",
    "esac",
    'exit "$hpctrain_rc"',
]


def step_loop(command: str) -> list[str]:
    """srun steps until one ends without naming a faulty node (launch.inplace), then the decision."""
    indent = lambda lines: [f"  {line}" for line in lines]  # noqa: E731
    return ["set +e",
            "while :; do",
            *indent(inplace.step_lines()),
            "  srun --kill-on-bad-exit=1 --unbuffered "
            f'${{hpctrain_step[@]+"${{hpctrain_step[@]}}"}} "${{{SRUN_VAR}[@]}}" {command} &',
            *indent(WAIT_LINES),
            *indent(inplace.after_step_lines()),
            "done",
            "set -e",
            *REQUEUE_LINES]


def render(p: JobPlan, command: str, host_python: str, standalone: bool,
           extra_env: dict[str, str] | None = None, source: str = "''") -> str:
    """The whole script; `command` is what follows `srun --kill-on-bad-exit=1 --unbuffered`;
    `source` (a shell word) is the hpctrain package the tasks bind into the image."""
    q = shlex.quote
    prof = p.profile
    lines = ["#!/bin/bash", *[f"# {h}".rstrip() for h in p.header], *sbatch_lines(p), "",
             "set -eo pipefail", ""]
    if p.workdirs:  # before the stop file, which lives under $PWD/.hpctrain
        lines += ["# Job array: element i trains run i in its own directory; it has its own job id",
                  "# ($SLURM_JOB_ID), so its own stop file, requeue (of <array>_<i>) and restart count.",
                  f"hpctrain_runs=({' '.join(q(d) for d in p.workdirs)})",
                  'cd "${hpctrain_runs[${SLURM_ARRAY_TASK_ID:?hpctrain: not an array job}]}"', ""]
    if standalone:
        lines += ["# What to train: a config file and key=value overrides, a JSON list or one per line (the",
                  "# environment wins).",
                  f"HPCTRAIN_CONFIG=${{HPCTRAIN_CONFIG-{q(p.config)}}}",
                  f"HPCTRAIN_SET=${{HPCTRAIN_SET-{q(encode_overrides(p.overrides))}}}",
                  "export HPCTRAIN_CONFIG HPCTRAIN_SET", ""]
    lines += ["# Python for every task: CONTAINER=apptainer|singularity|pyxis|none, HPCTRAIN_IMAGE=<image.sif, or",
              "# .sqsh/URI for pyxis>, HPCTRAIN_SOURCE= the hpctrain package the tasks run, bound into the image",
              f"# or first on PYTHONPATH (empty: the one the tasks' Python finds). pyxis: srun's {SRUN_VAR} options.",
              *python_lines(prof.container, p.binds, host_python, source, p.stage_to, p.nsys_ranks, p.nsys_dir), ""]
    mods = job_module_lines(prof.modules, prof.container_modules, prof.module_use, prof.module_purge)
    if mods:
        lines += ["# Site modules: HPCTRAIN_MODULES for the host's Python, HPCTRAIN_CONTAINER_MODULES in the",
                  "# image (empty skips them).", *mods, ""]
    lines += [f"# Fabric: {prof.fabric.kind}, and the profile's env. A variable already set in the",
              "# job's environment wins (e.g. NCCL_DEBUG=INFO sbatch ...).",
              *left_to_nccl(prof),
              *export_lines(fabric_env(prof), env_wins=True),
              f"export HPCTRAIN_FABRIC={q(prof.fabric.kind)}  # train.preflight's all-reduce figure",
              f"export HPCTRAIN_MAX_REQUEUES={prof.slurm.max_requeues}",
              f"export HPCTRAIN_MAX_PREEMPTIONS={prof.slurm.max_preemptions}",
              *export_lines(extra_env or {}), ""]
    lines += ["# Sites with SBATCH_EXPORT=NONE (or --export=NONE) give the job SLURM_EXPORT_ENV=NONE, and srun",
              "# would pass only SLURM_* on to the tasks (sbatch(1), --export): this shell's environment goes.",
              "export SLURM_EXPORT_ENV=ALL",
              "# srun 22.05-23.02 takes --cpus-per-task from SRUN_CPUS_PER_TASK only; 23.11 and later read",
              "# SLURM_CPUS_PER_TASK (set by the allocation) and ignore SRUN_CPUS_PER_TASK: this covers both.",
              'if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then',
              "  export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK", "fi", *MEMLOCK_LINES, ""]
    lines += ['echo "hpctrain: job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT:-0}) on '
              '${SLURM_JOB_NODELIST:-?}: ${SLURM_NNODES:-?} nodes x ${SLURM_NTASKS_PER_NODE:-?} tasks; '
              'modules: ${LOADEDMODULES:-none}; python: ${' + PY_VAR + '[*]}"', ""]
    lines += [*stop_lines(), ""]
    if prof.container.stage_image:
        lines += [*stage_image.batch_lines(prof.container.stage_image_to), ""]
    lines += [*inplace.setup_lines(p.spare_nodes, p.tasks_per_node),
              "# The batch host's death would leave a --no-kill job RUNNING without this shell: a guard on",
              "# another node requeues it then (launch.inplace.guard_lines).", *inplace.guard_lines(), "",
              "# One task per GPU. A task that dies ends the whole step (no hang). srun runs in the",
              "# background so that this shell can take signals while it waits; a step that failed on",
              "# nodes it named runs again without them (launch.inplace).",
              *step_loop(command), ""]
    return "\n".join(lines)

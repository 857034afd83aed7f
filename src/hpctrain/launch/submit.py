"""Submit the training job (or an evaluation, `hpctrain eval --nodes`) through submitit: Slurm
with a site profile, else locally (launch.prepare.slurm_profile says when). Both kinds share the
batch script, its container, modules, NCCL and stop lines; only the task (launch.task) and the job's folder differ."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.config import Config, ConfigError, check_batch, check_text, to_dict
from hpctrain.errors import LaunchError
from hpctrain.launch import submitit_glue as glue
from hpctrain.launch.container import bind_list
from hpctrain.launch.dryrun import PYTHON_HOOK, job_brief
from hpctrain.launch.failure import explain, no_result
from hpctrain.launch.localjob import HangupAsInterrupt, IgnoreSigint, signal_name, stop_tasks, take_sigint
from hpctrain.launch.private import private_dir
from hpctrain.launch.sbatch import JobPlan, call_log_env, render
from hpctrain.launch.task import eval_task, train_task
from hpctrain.launch.undo import undone_on
from hpctrain.run.layout import CODE, JOB, SUBMITIT, read_json
from hpctrain.run.source import Snapshot, snapshot_path, source_hash, take_snapshot
from hpctrain.site import runtimes
from hpctrain.site.profile import SlurmSection, parse_tres, time_minutes
from hpctrain.site.slurm_cli import client_version
from hpctrain.watch.jobinfo import local_state, submitted_clusters
from hpctrain.watch.lookup import remember_local_job

__all__ = [
    "LaunchError",
    "Request",
    "Submission",
    "eval_plan",
    "plan_job",
    "submit_eval_local",
    "submit_eval_slurm",
    "submit_local",
    "submit_slurm",
]


@dataclass(frozen=True)
class Submission:
    job_id: str
    run_dir: Path
    executor: str  # slurm | local
    log_hint: str
    job: Any = None
    snapshot: Snapshot | None = None  # the code the tasks run (Slurm jobs; hpctrain.run.source)


def write_job_record(run_dir: Path, record: dict) -> None:
    """`<run>/job.json`: which job owns the run (read by `hpctrain status` / `logs`)."""
    record = {**record, "submitted": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (run_dir / JOB).write_text(json.dumps(record, indent=1) + "\n")


def absolute_paths(cfg: Config) -> Config:
    """Jobs may start elsewhere: pin run.dir and data.root to absolute paths at submission."""
    data = cfg.data
    if data.root:
        data = dataclasses.replace(data, root=str(Path(data.root).expanduser().resolve()))
    run = dataclasses.replace(cfg.run, dir=str(Path(cfg.run.dir).expanduser().resolve()))
    return dataclasses.replace(cfg, data=data, run=run)


def local_job(folder: Path, tasks: int, timeout_min: int, fn, *args):
    """`fn(*args)` as `tasks` processes of submitit's local executor, logs in `folder`. Its controller
    ignores SIGINT: a Ctrl-C is the submitter's to forward (launch.localjob), which takes SIGINT
    back where it was started with it ignored (a script's background job): the job is in its foreground."""
    private_dir(folder)
    take_sigint()
    with IgnoreSigint():
        return glue.local_job(folder, tasks, timeout_min, fn, *args)


def check_free(run_dir: Path) -> None:
    """Refuse a local job in a run directory that a live process still trains (before anything is
    submitted or written: its job.json keeps naming the job that trains)."""
    if run_dir.is_dir() and local_state(run_dir):
        job = read_json(run_dir / JOB, {}).get("job_id")
        by = f"local job {job}" if job else "a running `hpctrain train`"
        raise LaunchError(
            f"run directory {run_dir} is in use by {by}: wait for it (hpctrain logs {run_dir} -f), "
            "stop it (Ctrl-C where it was started: it checkpoints), or give this run another run.name"
        )


def submit_local(cfg: Config, tasks: int = 2, timeout_min: int = 600) -> Submission:
    """Run the job on this machine with submitit's local executor (`tasks` DDP processes, gloo)."""
    cfg = absolute_paths(cfg)
    check_free(cfg.run_dir)
    folder = cfg.run_dir / SUBMITIT
    job = local_job(folder, tasks, timeout_min, train_task, to_dict(cfg))
    write_job_record(
        cfg.run_dir,
        {
            "job_id": str(job.job_id),
            "executor": "local",
            "tasks": tasks,
            "submitit": str(folder),
            "host": socket.gethostname(),
        },
    )
    remember_local_job(str(job.job_id), cfg.run_dir)  # `status ID` from any directory
    return Submission(
        str(job.job_id), cfg.run_dir, "local", shlex.join(["tail", "-f", str(folder / f"{job.job_id}_0_log.out")]), job
    )


def submit_eval_local(
    cfg: Config, weights: Path, ema: bool, out: Path, tasks: int = 2, timeout_min: int = 600
) -> Submission:
    """`hpctrain eval` as `tasks` local processes (gloo); logs in `out`/submitit. `run_dir` is `out`:
    the evaluated run's own job.json (its training job) is left alone."""
    cfg = absolute_paths(cfg)
    folder = out / SUBMITIT
    job = local_job(folder, tasks, timeout_min, eval_task, to_dict(cfg), str(weights), ema, str(out))
    return Submission(
        str(job.job_id), out, "local", shlex.join(["tail", "-f", str(folder / f"{job.job_id}_0_log.out")]), job
    )


def wait_local(
    sub: Submission,
    poll_s: float = 1.0,
    interrupted: str = "",
    what: str = "stops at the next step (checkpoint, stop record)",
) -> list[dict]:
    """Wait for every task's result; a failed task: JobFailed, the task's UserError in one line or
    a crash's traceback (launch.failure). A Ctrl-C (or `interrupted`: the signal the caller had,
    SIGINT, SIGTERM or SIGHUP) is passed to the tasks, once (launch.localjob.stop_tasks; `what`
    they do then); a second one kills them."""
    by = interrupted
    try:
        with HangupAsInterrupt():  # a closed terminal or a SIGTERM: as a Ctrl-C
            while not by and not sub.job.done():
                time.sleep(poll_s)
    except KeyboardInterrupt as e:
        by = signal_name(e)
    if by:
        with HangupAsInterrupt():  # a second SIGTERM kills the tasks as a second Ctrl-C does
            stop_tasks(sub.job.done, sub.job.paths.folder, sub.job_id, what, by)
    try:
        return sub.job.results()
    except glue.RESULT_ERRORS:
        folder = sub.job.paths.folder
        raise (
            explain(folder, sub.job_id, sub.job.num_tasks, "local job") or no_result(folder, sub.job_id, "local job")
        ) from None


# --------------------------------------------------------------------------- Slurm


@dataclass(frozen=True)
class Request:
    """What the command line asked for; None: take the profile's default."""

    nodes: int | None = None  # the most nodes (--nodes N, or MAX of --nodes MIN-MAX)
    min_nodes: int | None = None  # MIN of --nodes MIN-MAX (None: the profile's slurm.min_nodes)
    gpus_per_node: int | None = None
    time: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool | None = None
    spare_nodes: int | None = None
    nsys_ranks: tuple[int, ...] = ()  # --nsys-ranks: global ranks that run under nsys

    def check(self) -> None:
        """The text flags become `#SBATCH` lines: refuse control characters (a newline would end
        the line and run the rest as a command)."""
        for key in ("time", "partition", "account", "qos", "constraint"):
            value = getattr(self, key)
            if value is not None:
                check_text(value, f"--{key}")


def check_resolved_paths(cfg: Config) -> None:
    """Paths made absolute at submission take in the working directory (or HOME), which the config
    check never saw; they reach `#SBATCH --output/--chdir` and the srun line."""
    check_text(cfg.run.dir, f"run.dir (made absolute: {cfg.run.dir!r})")
    if cfg.data.root:
        check_text(cfg.data.root, f"data.root (made absolute: {cfg.data.root!r})")


def check_request(profile, req: Request) -> tuple[int, int, str]:
    """(nodes, GPUs = tasks per node, time limit) of `req` under `profile`; LaunchError with the fix."""
    req.check()
    s = profile.slurm
    nodes = 1 if req.nodes is None else req.nodes
    if nodes < 1:
        raise LaunchError(f"--nodes={nodes}: a job needs at least one node; use --nodes 1 or more")
    gpn = s.gpus_per_node if req.gpus_per_node is None else req.gpus_per_node
    if gpn < 1:
        raise LaunchError(
            f"--gpus-per-node={gpn}: every node runs one task per GPU, so at least 1 is "
            "needed; use --gpus-per-node 1 or more (CPU-only clusters: "
            "slurm.request_gpus: false)"
        )
    if gpn > s.max_gpus_per_node:
        total = nodes * gpn
        raise LaunchError(
            f"--gpus-per-node={gpn}: nodes of cluster {profile.name!r} have at most {s.max_gpus_per_node} "
            f"GPUs (slurm.max_gpus_per_node); use --gpus-per-node {s.max_gpus_per_node} with "
            f"--nodes {-(-total // max(1, s.max_gpus_per_node))} for {total} GPUs"
        )
    time = req.time or s.time
    try:
        time_minutes(time)
    except ConfigError as e:
        raise LaunchError(f"--time: {e}") from None
    spares = spare_nodes(profile, req)
    check_limits(profile, req, nodes + spares, gpn, time)
    return nodes, gpn, time


def min_nodes(profile, req: Request, nodes: int) -> int:
    """The fewest nodes the job trains on (--nodes MIN-MAX, else slurm.min_nodes; 0 there: `nodes`);
    LaunchError for a MIN above the MAX."""
    lo = req.min_nodes if req.min_nodes is not None else (profile.slurm.min_nodes or nodes)
    if not 1 <= lo <= nodes:
        where = "--nodes" if req.min_nodes is not None else "slurm.min_nodes"
        raise LaunchError(
            f"{where}: the fewest nodes ({lo}) must be between 1 and the job's {nodes}; use --nodes "
            f"{min(max(lo, 1), nodes)}-{nodes}, or --nodes {nodes} for exactly {nodes}"
        )
    return lo


# Spares share the allocation with `srun --overlap` steps (launch/shell: the restarted training
# step, the probes, the guard); Slurm NEWS, 22.05.0: "srun --overlap now allows the step to share all
# resources (CPUs, memory, and GRES), where previously --overlap only allowed the step to share CPUs".
MIN_SPARES_SLURM = (22, 5)


def spare_nodes(profile, req: Request) -> int:
    """Hot spare nodes of the job (--spare-nodes, else slurm.spare_nodes); LaunchError below 0, or
    with spares on a login node whose Slurm is older than MIN_SPARES_SLURM (no answer: not checked)."""
    k = profile.slurm.spare_nodes if req.spare_nodes is None else req.spare_nodes
    if k < 0:
        raise LaunchError(f"--spare-nodes={k}: use 0 (no spares) or more")
    version = client_version() if k else None
    if version and version[0] < MIN_SPARES_SLURM:
        raise LaunchError(
            f"--spare-nodes={k} (or slurm.spare_nodes): spare nodes need Slurm 22.05 or newer (before it "
            f"`srun --overlap` shares only CPUs, so a restarted step waits for the failed one's memory and "
            f"GPUs), and `sbatch --version` says {version[1]!r}: submit with --spare-nodes 0"
        )
    return k


def check_limits(profile, req: Request, nodes: int, gpn: int, time: str) -> None:
    """Refuse a request over a limit the profile knows (slurm.limits, read by `cluster init`): sbatch
    would refuse it ("Requested time limit is invalid", DenyOnLimit QOS) or, worse, accept it and the
    job pends for ever (reason QOSMaxWallDurationPerJobLimit, QOSMaxGRESPerJob...)."""
    s, lim = profile.slurm, profile.slurm.limits
    part = s.partition if req.partition is None else req.partition
    qos = s.qos if req.qos is None else req.qos
    where = f"cluster profile {profile.name!r}, slurm.limits"
    checks = []
    if lim.max_time and lim.partition and part == lim.partition:
        checks.append(
            (
                lim.max_time,
                f"partition {part}'s MaxTime={lim.max_time} (`scontrol show partition {part}`; {where}.max_time)",
                "another --partition",
            )
        )
    if lim.qos_max_wall and lim.qos and qos == lim.qos:
        checks.append(
            (
                lim.qos_max_wall,
                f"QOS {qos}'s MaxWall={lim.qos_max_wall} (`sacctmgr show qos {qos}`; {where}.qos_max_wall)",
                "another --qos",
            )
        )
    for limit, what, other in checks:
        if time_minutes(time) > time_minutes(limit):
            raise LaunchError(f"--time={time} is over {what}: use --time {limit} or less, or {other}")
    if not (lim.qos and qos == lim.qos):
        return
    cpus = cpus_per_task(s, gpn) * gpn
    asked = {"node": (nodes, 1), "gres/gpu": (nodes * gpn if s.request_gpus else 0, gpn), "cpu": (nodes * cpus, cpus)}
    for key, label in (("qos_max_tres_per_job", "MaxTRESPerJob"), ("qos_max_tres_per_user", "MaxTRESPerUser")):
        for name, limit in parse_tres(getattr(lim, key)).items():
            base = "gres/gpu" if name.startswith("gres/gpu") else name
            total, per_node = asked.get(base, (0, 0))
            if per_node and total > limit:
                fix = (
                    f"--nodes {limit // per_node} or fewer"
                    if limit >= per_node
                    else f"--nodes 1 --gpus-per-node {limit}"
                    if base == "gres/gpu"
                    else f"--cluster-set slurm.cpus_per_node={limit}"
                )
                raise LaunchError(
                    f"--nodes={nodes} x {gpn} tasks asks {base}={total}, over QOS {qos}'s {label} {name}={limit} "
                    f"(`sacctmgr show qos {qos}`; {where}.{key}): use {fix}, or another --qos"
                )


def cpus_per_task(s: SlurmSection, tasks_per_node: int) -> int:
    """--cpus-per-task: a node's CPUs per GPU (slurm.cpus_per_node / max_gpus_per_node, the node's
    GPUs), so that a job on some of a node's GPUs asks their share of its cores, not all of them; on
    nodes without GPUs (request_gpus false) the node's CPUs per task. 0: Slurm's default (1 per task)."""
    if not s.cpus_per_node:
        return 0
    slots = s.max_gpus_per_node if s.request_gpus and s.max_gpus_per_node else tasks_per_node
    return max(1, s.cpus_per_node // max(1, slots))


def job_plan(
    profile,
    req: Request,
    nodes: int,
    gpn: int,
    time: str,
    job_name: str,
    folder: Path | None,
    binds: list[str],
    header: list[str] = (),
):
    """The JobPlan from checked resources; `folder`: the submitit folder (batch log there, the job
    runs in its parent), None for a stand-alone script."""
    s = profile.slurm
    pick = lambda a, b: b if a is None else a
    return JobPlan(
        profile=profile,
        job_name=job_name,
        nodes=nodes,
        tasks_per_node=gpn,
        gpus_per_node=gpn if s.request_gpus else 0,
        cpus_per_task=cpus_per_task(s, gpn),
        mem=s.mem_per_node,
        time=time,
        partition=pick(req.partition, s.partition),
        account=pick(req.account, s.account),
        qos=pick(req.qos, s.qos),
        constraint=pick(req.constraint, s.constraint),
        exclusive=pick(req.exclusive, s.exclusive),
        output="" if folder is None else str(folder / "%j_0_log.out"),
        chdir="" if folder is None else str(folder.parent),
        binds=binds,
        header=list(header),
        spare_nodes=spare_nodes(profile, req),
        min_nodes=min_nodes(profile, req, nodes),
    )


def plan_job(cfg: Config, profile, req: Request, standalone: bool = False, header: list[str] = ()):
    """Check the request against the profile and the config; the JobPlan for the batch script.

    Imports no torch: runs on login nodes. Raises LaunchError (or ConfigError) with the fix.
    """
    nodes, gpn, time = check_request(profile, req)
    check_batch(cfg, nodes * gpn)  # a range's fewest nodes split it too: check_batch refuses only more ranks than g
    if standalone:  # a file for another machine: keep paths as written, bind only absolute ones
        binds = bind_list(
            profile.container,
            [p for p in (cfg.data.root, cfg.run.dir) if p and Path(p).is_absolute()],
            writable=[cfg.run.dir],
        )
        folder = None
    else:
        cfg = absolute_paths(cfg)
        check_resolved_paths(cfg)
        binds = bind_list(profile.container, [cfg.data.root, cfg.run.dir], writable=[cfg.run.dir])
        folder = cfg.run_dir / SUBMITIT
    plan = job_plan(profile, req, nodes, gpn, time, cfg.run.name, folder, binds, header)
    return with_nsys(with_stage(plan, cfg.data.stage_to), cfg, req.nsys_ranks)


def parse_ranks(text: str) -> tuple[int, ...]:
    """`--nsys-ranks 0,8` → (0, 8); LaunchError for anything but comma-separated whole numbers."""
    try:
        ranks = tuple(sorted({int(w) for w in text.split(",") if w.strip()}))
    except ValueError:
        ranks = ()
    if not ranks or min(ranks) < 0:
        raise LaunchError(f"--nsys-ranks {text!r}: give global ranks as comma-separated whole numbers, e.g. 0,8")
    return ranks


def with_nsys(plan, cfg: Config, ranks: tuple[int, ...]):
    """The plan with --nsys-ranks: ranks inside the job, and a log.profile_steps window for nsys to
    capture (--capture-range=cudaProfilerApi records nothing without it)."""
    if not ranks:
        return plan
    if max(ranks) >= plan.world_size:
        raise LaunchError(
            f"--nsys-ranks: rank {max(ranks)} is not in this job of {plan.world_size} tasks "
            f"(ranks 0-{plan.world_size - 1}): pick ranks below {plan.world_size}"
        )
    if not cfg.log.profile_steps.strip():
        raise LaunchError(
            "--nsys-ranks needs log.profile_steps (the steps nsys records, between "
            "cudaProfilerStart/Stop): add --set log.profile_steps=A-B, e.g. 20-25"
        )
    return dataclasses.replace(plan, nsys_ranks=list(ranks), nsys_dir=str(Path(cfg.run.dir) / cfg.run.name / "profile"))


def with_stage(plan, stage_to: str):
    """The plan with data.stage_to; refused (LaunchError) where the profile's runtime cannot do it."""
    runtimes.get(plan.profile.container.runtime).check(plan.binds, stage_to)
    return dataclasses.replace(plan, stage_to=stage_to)


def eval_plan(cfg: Config, profile, req: Request, weights: Path, out: Path):
    """The JobPlan of `hpctrain eval --nodes`: the training job's checks of the request and its
    script, without the batch checks (evaluation splits any batch, train/evaluate.eval_config);
    binds the data, the weights and the output folder (absolute paths: `resolve_eval_paths`)."""
    nodes, gpn, time = check_request(profile, req)
    cfg = absolute_paths(cfg)
    check_resolved_paths(cfg)
    check_text(str(weights), f"the weights path {str(weights)!r}")
    check_text(str(out), f"the output folder {str(out)!r}")
    header = [
        f"hpctrain eval: hpctrain.launch.task.eval_task of {weights}",
        f"outputs: {out}/summary.json, {out}/per_class.csv",
    ]
    binds = bind_list(profile.container, [cfg.data.root, str(weights), str(out)], writable=[str(out)])
    plan = job_plan(profile, req, nodes, gpn, time, f"{cfg.run.name}-eval", out / SUBMITIT, binds, header)
    return with_stage(plan, cfg.data.stage_to)


def submitit_command(folder: Path, job: str = "%j") -> str:
    """srun arguments of a submitit job: per-task logs in the submitit folder, then its runner
    (`job`: `%A_%a` for an array element, as submitit names them)."""
    out, err = folder / f"{job}_%t_log.out", folder / f"{job}_%t_log.err"
    return (
        f"--output {shlex.quote(str(out))} --error {shlex.quote(str(err))} "
        f"{PYTHON_HOOK} -u -m hpctrain.launch.task {shlex.quote(str(folder))}"
    )


def slurm_script(plan, folder: Path, job: str = "%j", snap: Snapshot | None = None) -> str:
    """The batch script `hpctrain submit` (and `hpctrain eval --nodes`) hands to sbatch (what
    --dry-run=full prints); `folder`: the job's submitit folder; a sweep passes its own and `job="%A_%a"`.
    `snap`: the code snapshot the tasks run (take_snapshot); None (a dry run, which writes nothing):
    the path a snapshot of this package would have, beside `folder`."""
    command, python, env, source = slurm_inputs(plan, folder, job, snap)
    return render(plan, command, python, False, env, shlex.quote(source) if source else "''")


def slurm_brief(plan, folder: Path, job: str = "%j") -> str:
    """What --dry-run prints of that script: its header, the tasks' environment, the step command and
    a line per shell part (launch.dryrun)."""
    command, python, env, source = slurm_inputs(plan, folder, job, None)
    return job_brief(plan, command, python, env, source)


def slurm_inputs(plan, folder: Path, job: str, snap: Snapshot | None) -> tuple[str, str, dict[str, str], str]:
    """slurm_script's values: the step's command, the host's Python, the exports, the snapshot's path
    ("" where the tasks run the image's own hpctrain: container.bind_source false)."""
    digest = snap.hash if snap else source_hash()
    env = {
        "SUBMITIT_EXECUTOR": "slurm",
        "HPCTRAIN_LAUNCHER": "submitit-slurm",
        "HPCTRAIN_SOURCE_HASH": digest,
        "HPCTRAIN_SUBMITIT_VERSION": glue.VERSION,
        **call_log_env(os.environ),
    }
    path = snap.path if snap else snapshot_path(folder.parent, digest)
    source = str(path) if plan.profile.container.bind_source else ""
    return submitit_command(folder, job), shlex.quote(sys.executable), env, source


def job_snapshot(plan, folder: Path) -> Snapshot | None:
    """The code snapshot of a job whose submitit folder is `folder`, in `folder`'s parent (the run,
    sweep or evaluation directory); None when the profile runs the image's own copy
    (container.bind_source: false). Taken once per submission: a requeue reruns the same script."""
    if not plan.profile.container.bind_source:
        return None
    if ":" in str(folder.parent):
        raise LaunchError(
            f"{folder.parent} holds ':', which separates entries of PYTHONPATH and Apptainer's "
            "--bind: the job could not use its code snapshot there; choose a run.dir without ':'"
        )
    return take_snapshot(folder.parent)


def standalone_plan(
    cfg: Config, profile, req: Request, command: str, config: str, overrides: list[str], path: str = "slurm/vit.sbatch"
):
    """The plan of a stand-alone script written to `path` (`slurm/vit.sbatch`): same checks, paths
    as written, usage notes in the header."""
    path = shlex.quote(path)
    header = [
        f"hpctrain: ViT training, {req.nodes or 1} node(s) x "
        f"{req.gpus_per_node or profile.slurm.gpus_per_node} GPUs (cluster profile {profile.name}).",
        f"Generated by `{command}`.",
        "Change the config or profile and run that command again instead of editing this file.",
        "",
        f"Run as is:  sbatch {path}",
        "Overrides need no edit: sbatch options on the command line win over the #SBATCH lines, and",
        "the settings below read the environment. E.g. a CPU-only try on the digits demo, from the",
        "root of an hpctrain checkout, without the image:",
        "  CONTAINER=none HPCTRAIN_MODULES= HPCTRAIN_CONFIG=configs/digits_vit.yaml \\",
        '  HPCTRAIN_SET=\'["data.prepare=digits", "data.root=data/digits", "run.name=cpu-example", '
        '"train.epochs=1"]\' \\',
        "  sbatch --nodes=2 --ntasks-per-node=2 --gpus-per-node=0 --cpus-per-task=1 --mem=0 --partition=debug \\",
        f"  {path}",
        "",
    ]
    plan = plan_job(cfg, profile, req, standalone=True, header=header)
    return dataclasses.replace(plan, config=config, overrides=list(overrides))


def standalone_script(plan) -> str:
    """`slurm/vit.sbatch`: the same script, running `python3 -m hpctrain train` under srun."""
    # the checkout it is submitted from (the header says: from the repository root), if any
    # (`|| true`: under `set -e` a failing substitution in an assignment would end the script)
    source = (
        '$([ -d src/hpctrain ] && echo "$PWD/src/hpctrain" || true)' if plan.profile.container.bind_source else "''"
    )
    return render(
        plan, f"{PYTHON_HOOK} -m hpctrain train", "python3", True, {"HPCTRAIN_LAUNCHER": "sbatch-script"}, source
    )


def check_image(profile) -> None:
    """A job whose image is missing would fail on every node: refuse it before submission."""
    c = profile.container
    local = runtimes.get(c.runtime).image_kind == "sif" or c.image.startswith(("/", "./", "../"))  # enroot: or a URI
    if c.runtime != "none" and local and not Path(c.image).is_file():
        raise LaunchError(
            f"container.image {c.image!r} does not exist: build or copy the image there, point "
            "--cluster-set container.image=PATH at it, or run on the host's Python with "
            "--cluster-set container.runtime=none"
        )


def slurm_spec(plan, folder: Path, script: str) -> glue.SlurmSpec:
    """What submitit's executor needs of `plan`'s job, its batch script `script`."""
    return glue.SlurmSpec(
        folder=folder,
        script=script,
        nodes=plan.nodes,
        tasks_per_node=plan.tasks_per_node,
        time_min=time_minutes(plan.time),
        job_name=plan.job_name,
        max_requeues=plan.profile.slurm.max_requeues,
        python=PYTHON_HOOK,
    )


def slurm_job(plan, folder: Path, fn, *args):
    """Submit `fn(*args)` through submitit's Slurm executor with our batch script, its tasks on a
    snapshot of this package (job_snapshot). Returns (job, snapshot). The image was checked by
    launch.prepare, before anything was written."""
    try:
        with undone_on((*glue.SUBMIT_ERRORS, LaunchError), folder.parent, (SUBMITIT, CODE)):  # refused: as found
            private_dir(folder)
            snap = job_snapshot(plan, folder)
            return glue.slurm_job(slurm_spec(plan, folder, slurm_script(plan, folder, snap=snap)), fn, *args), snap
    except glue.SUBMIT_ERRORS as e:
        raise LaunchError(f"sbatch refused the job: {str(e).strip().splitlines()[-1]}") from None


def submit_slurm(cfg: Config, plan) -> Submission:
    """Submit through submitit's Slurm executor with our batch script; record the job in the run."""
    cfg = absolute_paths(cfg)
    run_dir = cfg.run_dir
    folder = run_dir / SUBMITIT
    job, snap = slurm_job(plan, folder, train_task, to_dict(cfg))
    write_job_record(
        run_dir,
        {
            "job_id": str(job.job_id),
            "executor": "slurm",
            "cluster": plan.profile.name,
            "nodes": plan.nodes,
            "tasks_per_node": plan.tasks_per_node,
            "submitit": str(folder),
            "code": str(snap.path) if snap else None,
            # sbatch went to these clusters (SBATCH_CLUSTERS/SLURM_CLUSTERS), which sacct must be told
            "slurm_clusters": submitted_clusters(),
        },
    )
    return Submission(
        str(job.job_id), run_dir, "slurm", shlex.join(["hpctrain", "logs", str(run_dir), "-f"]), job, snap
    )


def submit_eval_slurm(cfg: Config, plan, weights: Path, ema: bool, out: Path) -> Submission:
    """`hpctrain eval` as a Slurm job (plan: eval_plan); rank 0 writes `out`/summary.json."""
    folder = out / SUBMITIT
    job, snap = slurm_job(plan, folder, eval_task, to_dict(absolute_paths(cfg)), str(weights), ema, str(out))
    return Submission(
        str(job.job_id), out, "slurm", shlex.join(["tail", "-f", str(folder / f"{job.job_id}_0_log.out")]), job, snap
    )

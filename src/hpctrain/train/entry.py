"""What every rank runs: set up the process group, the run directory, loaders and model; train.

The same entry serves `hpctrain train` (one process, torchrun or srun) and submitit jobs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import platform
import shutil
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hpctrain import __version__, memory
from hpctrain.ckpt_interval import mtbf_source
from hpctrain.config import Config, build, check_batch, save, to_dict
from hpctrain.data.build import build_eval_loaders
from hpctrain.errors import UserError
from hpctrain.lr_rule import lr_rule
from hpctrain.models.vit import build_vit
from hpctrain.run import faultlog, requeue, resize, source, startup
from hpctrain.run.layout import CONFIG, ENV, JOB, JOB_RECORD, LOGS, METRICS
from hpctrain.run.metrics import progress_log, read_metrics, summary_table
from hpctrain.run.rundir import RunDirBusy, RunLock
from hpctrain.train import collective, compat, compile_cache, finetune
from hpctrain.train import dist as distmod
from hpctrain.train import stop as stopmod
from hpctrain.train.ckpt import checkpoint as ckpt
from hpctrain.train.ckpt.resume_checks import RunFinished, check_compatible, check_unfinished
from hpctrain.train.collective import agree
from hpctrain.train.health import preflight, watchdog
from hpctrain.train.loop import build_trainer
from hpctrain.train.observe import trackers
from hpctrain.train.stop import StopFlag
from hpctrain.version import dist_versions

log = logging.getLogger("hpctrain")
SECRET_WORDS = ("TOKEN", "KEY", "PASSWORD", "SECRET", "CREDENTIAL", "PASSWD")


def setup_logging(run_dir: Path | None, rank: int) -> None:
    """Console: rank 0's INFO, other ranks' warnings; `<run>/logs/rank-<r>.log`: everything, progress
    lines included (the console has those from Progress already)."""
    log.handlers.clear()
    log.setLevel(logging.INFO)
    log.propagate = False
    fmt = logging.Formatter(f"%(asctime)s [rank {rank}] %(levelname)s %(message)s", "%H:%M:%S")
    h = logging.StreamHandler(sys.stderr)
    h.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    h.addFilter(lambda r: r.name != progress_log.name)
    h.setFormatter(fmt)
    log.addHandler(h)
    if run_dir:
        logs = run_dir / LOGS
        logs.mkdir(parents=True, exist_ok=True, mode=0o755)
        fh = logging.FileHandler(logs / f"rank-{rank}.log")
        fh.setFormatter(fmt)
        log.addHandler(fh)


def _git_commit() -> str | None:
    snap = source.manifest()
    if snap is not None:  # a snapshot under the run directory: the commit it was taken from, at submission
        return snap.get("git_commit")
    return source.commit_of(source.package_dir())


def _dali_version() -> str | None:
    """DALI's version from the package metadata: importing DALI for it costs every rank ~1 s at
    start-up (every requeue, too) on runs that use the torch loader."""
    dali = sys.modules.get("nvidia.dali")
    if dali is not None:
        return getattr(dali, "__version__", None)
    return ", ".join(v for _, v in sorted(dist_versions("nvidia-dali").items())) or None


def environment_record(info: distmod.DistInfo, device) -> dict[str, Any]:
    """Versions, job and host facts for env.json; no secret-looking variables."""
    rec: dict[str, Any] = {
        "hpctrain": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "host": socket.gethostname(),
        "device": str(device),
        "world_size": info.world_size,
        "launcher": info.source,
        "git_commit": _git_commit(),
        "rendezvous": f"{info.master_addr}:{info.master_port}" if info.world_size > 1 else None,
        "pythonpath": os.environ.get("PYTHONPATH"),
        "cuda_home": os.environ.get("CUDA_HOME"),
        "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if device.type == "cuda":
        rec["gpu"] = torch.cuda.get_device_name(device)
        rec["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    rec["dali"] = _dali_version()
    keep: tuple[str, ...] = (
        "SLURM_JOB_ID",
        "SLURM_JOB_NODELIST",
        "SLURM_STEP_NODELIST",
        "SLURM_STEP_ID",
        "SLURM_NNODES",
        "SLURM_NTASKS",
        "SLURM_RESTART_COUNT",
        "SLURM_JOB_PARTITION",
        "SLURM_CLUSTER_NAME",  # the cluster it ran on: `hpctrain status` asks sacct there (-M)
        "APPTAINER_CONTAINER",
        "SINGULARITY_CONTAINER",
        "HPCTRAIN_IMAGE",
    )
    keep += ("LOADEDMODULES", *sorted(k for k in os.environ if k.startswith("HPCTRAIN_")))
    rec["env"] = {k: os.environ[k] for k in keep if k in os.environ and not any(w in k.upper() for w in SECRET_WORDS)}
    return rec


def run(cfg: Config | dict, stop: StopFlag | None = None) -> dict[str, Any]:
    """Train per `cfg` on this rank; returns a summary (the same on every rank).

    The stop handlers (USR2, TERM) are installed before the rendezvous and the model build, so a
    signal during start-up is honoured at the first step boundary instead of killing the task; the
    entry points install them before they import this module (launch.task, cli.train), so the
    seconds of importing torch are covered too. After a stop, `summary["requeue"]` says whether the
    batch shell requeues.
    """
    stop = stop or stopmod.install()
    startup.mark_process()  # where launch.task did not (hpctrain train): torch is imported by now
    startup.mark("imports")
    cfg = build(Config, cfg) if isinstance(cfg, dict) else cfg
    assert isinstance(cfg, Config)  # for the reader (and mypy): a mapping is built into one above
    info = distmod.detect()
    if not info.is_main:  # the stop agreement ORs rank 0's time-limit bit to every rank: one stat per job, not per rank
        stop.end_file = None
    trackers.check_packages(cfg.log.trackers)  # a missing package: one line, before anything starts
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    want = cfg.train.device
    use_cuda = want == "cuda" or (want == "auto" and torch.cuda.is_available())
    if use_cuda:
        device = torch.device("cuda", info.local_rank % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(device)
        cfg = fit_to_gpu(cfg, info.world_size, torch.cuda.get_device_properties(device).total_memory)
    else:
        device = torch.device("cpu")
    check_batch(cfg, info.world_size)
    compat.check_train(cfg, device)  # what this torch cannot run: every rank fails alike, at once
    backend = "nccl" if use_cuda else "gloo"
    # before the process group exists (NCCL reads them then), in every launcher's path: srun, submitit, torchrun
    fr_env = (
        watchdog.set_flight_recorder_env(os.environ, backend, cfg.run_dir.resolve() / LOGS)
        if info.world_size > 1
        else {}
    )
    with contextlib.ExitStack() as stack:  # unwound last in, first out: trainer, lock, process group
        collective.init(info, backend, cfg.dist.pg_timeout_s, group_of_one=cfg.dist.parallel == "fsdp")
        stack.push(unless_broken(collective.shutdown))
        startup.mark("process_group")
        summary = _run(cfg, stop, info, device, fr_env, stack)
    return summary


def fit_to_gpu(cfg: Config, world_size: int, capacity: int) -> Config:
    """The config at this world size: where the per-GPU micro-batch of the recipe's global batch would
    exceed the GPU's memory (a node range on fewer nodes, fewer nodes after a loss), more accumulation
    steps, the global batch unchanged (memory.fit_accum; docs/launch.md, "Node ranges and fewer nodes")."""
    acc = memory.fit_accum(cfg, world_size, capacity)
    if acc == cfg.train.accum_steps:
        return cfg
    log.warning(
        "train.accum_steps %d -> %d: at world size %d the per-GPU batch of the global batch %d would not fit "
        "in %.0f GB (memory estimate)",
        cfg.train.accum_steps,
        acc,
        world_size,
        cfg.data.global_batch,
        capacity / 1e9,
    )
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, accum_steps=acc))


def remove_if_refused(run_dir: Path, started: list[bool]) -> Callable[..., bool]:
    """An exit callback for `ExitStack.push`: a start refused in one line (a UserError: a missing
    init_from file, a loader that cannot read the data) before training began and before any record
    removes the run directory it made, which would hold only its config, env and log: `status` could
    not read it, and a corrected rerun would find it. Never swallows the exception."""

    def exit_(exc_type, exc, tb) -> bool:
        if isinstance(exc, UserError) and not started[0] and not (run_dir / METRICS).exists():
            shutil.rmtree(run_dir, ignore_errors=True)  # (a preflight's record is kept, and its run)
        return False

    return exit_


def unless_broken(close: Callable[[], object]) -> Callable[..., bool]:
    """An exit callback for `ExitStack.push` that calls `close` on a return and after an error
    every rank meets alike, but not after a failed collective or an interrupt: a group a peer left
    is unusable (no orderly shutdown, as train.collective.diagnose's callers do), and a second Ctrl-C means
    now. Never swallows the exception."""

    def exit_(exc_type, exc, tb) -> bool:
        if exc is None or (isinstance(exc, Exception) and not collective.peer_failure(exc)):
            close()
        return False

    return exit_


def _run(
    cfg: Config,
    stop: StopFlag,
    info: distmod.DistInfo,
    device,
    fr_env: dict[str, str],
    stack: contextlib.ExitStack,
) -> dict[str, Any]:
    """`run` once the process group exists: what it opens (the run lock, the trainer) goes on
    `stack`, so every way out releases it; the trainer and model go out of scope on return, before
    the stack destroys the process group (docs/communication.md, "Exit")."""
    # the gloo group for CPU-tensor agreement wherever the default group is NCCL, a group of one included
    control = collective.control_group(cfg.dist.pg_timeout_s)

    os.umask(0o022)  # run directories and logs: no group/world write
    run_dir = cfg.run_dir.resolve()
    fresh = info.is_main and not run_dir.exists()  # this start makes the run directory
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
    lock = RunLock(run_dir)
    holder = lock.acquire() if info.is_main else None
    stack.callback(lock.release)  # a no-op where it was not taken
    started = [False]  # set once the Trainer exists: what it writes is the run's
    if fresh:
        stack.push(remove_if_refused(run_dir, started))
    if agree(holder is not None, control):
        raise RunDirBusy(
            f"run directory {run_dir} is in use by {holder or 'another job (see rank 0)'}; "
            "wait for that job to end, or give this run another run.name"
        )
    setup_logging(run_dir, info.rank)
    if lock.note:  # no lock on this file system, or a stale one taken over: the run's log says so
        log.warning(lock.note)
    stop.log_new()
    if fr_env:
        log.info("NCCL flight recorder on: %s", " ".join(f"{k}={v}" for k, v in fr_env.items()))
    try:
        code = source.check(os.environ)  # every rank: the code that submitted the job, or no training
    except source.LaunchError as e:
        log.error("%s", e)
        raise
    over = None
    if info.is_main:
        requeue.record_start(run_dir)  # the checkpoint this attempt starts from: its progress is measured from it
        try:
            requeue.check_budget(requeue.budget(run_dir))
        except requeue.LaunchError as e:
            over = e
    if agree(over is not None, control):
        raise over or requeue.LaunchError("this job is past its requeue budget (see rank 0's log)")
    resume = ckpt.find_resume(run_dir, cfg.run.resume)
    if resume:
        check_compatible(cfg, resume[1], resume[0])  # before anything in the run directory changes
    train_loader, val_loader = build_eval_loaders(cfg, info.rank, info.world_size, device)  # {split: loader}
    if resume:  # every rank reads the same checkpoint and data: all refuse alike (RunFinished)
        try:
            check_unfinished(cfg, resume[1], resume[0], run_dir, len(train_loader))
        except RunFinished:
            if not finished_by_this_job(run_dir, os.environ):
                raise
            # a stop signal that came as the last step ended (the time limit's, the batch shell's clock)
            # had this job requeued or restarted: the run is done, and this attempt says so and ends
            log.warning(
                "the run finished in an earlier attempt of this job (Slurm job %s, step %d): nothing left to train",
                os.environ.get("SLURM_JOB_ID"),
                int(resume[1]["step"]),
            )
            return {
                "status": "finished",
                "run_dir": str(run_dir),
                "step": int(resume[1]["step"]),
                "rank": info.rank,
                "world_size": info.world_size,
                "config": to_dict(cfg),
                "requeue": False,
                "stop_kind": None,
            }
    resolved = resolved_record(cfg, info.world_size)
    resolved.update(watchdog.heartbeats_record(cfg.hang_s, info.world_size))  # the node files' period (issue 55)
    before = resize.previous_size(run_dir) if info.is_main else None  # the last attempt's, before env.json is rewritten
    if info.is_main:
        save(cfg, run_dir / CONFIG)
        write_env(run_dir, {**environment_record(info, device), "source": code, "resolved": resolved})
        record_job(run_dir)
    log.info(
        "run directory %s; world size %d on %s (%s); rank %d on host %s",
        run_dir,
        info.world_size,
        device,
        info.source,
        info.rank,
        socket.gethostname(),
    )
    log.info(
        "batch %d global = %d per rank x %d ranks x %d accumulation steps; lr %s",
        cfg.data.global_batch,
        resolved["per_rank_batch"],
        info.world_size,
        cfg.train.accum_steps,
        resolved["lr_rule"],
    )

    if cfg.health.preflight:  # every start: the nodes of this attempt, before any step (docs/preflight.md)
        try:
            preflight.run(cfg, info, device, run_dir, train_loader, control)
        except preflight.PreflightFailed as e:
            log.error("%s", e)
            raise
        startup.mark("preflight")
    cache = compile_cache.setup(cfg, run_dir)  # compile.enabled: before anything is compiled
    torch.manual_seed(cfg.train.seed)  # same initial weights on every rank and every attempt
    model = build_vit(cfg.model)
    if cfg.model.init_from and resume:
        log.info(
            "model.init_from=%s ignored: this run resumes from %s (the run's checkpoint wins)",
            cfg.model.init_from,
            resume[0],
        )
    elif cfg.model.init_from:  # every rank reads it: the EMA copy and FSDP shards start from it too
        finetune.load_into(model, cfg.model.init_from, cfg.model.init_ema)
    started[0] = True
    trainer = build_trainer(cfg, info, device, run_dir, train_loader, val_loader, model, control, stop)
    # its threads and collectives ended, its hold on the process groups dropped (Trainer.close):
    # at once on a return (below), by the stack after an error
    stack.push(unless_broken(trainer.close))
    startup.mark("model")
    if info.is_main:  # the batch shell's restarts on spare nodes and exclusions so far (hpctrain.run.faultlog)
        shell = faultlog.record_new(trainer.metrics, read_metrics(run_dir / METRICS))
        for r in shell:
            log.warning(
                "%s of job %s (restart %s, attempt %s) without %s: %s",
                r["kind"],
                r["job"],
                r["slurm_restart"],
                r["attempt"],
                ",".join(r["nodes"]) or "-",
                r["why"],
            )
        now = {k: resolved[k] for k in resize.SIZE_KEYS}
        changed = resize.change(before, now, shell, os.environ)
        if changed:  # another world size than the last attempt's: the same global batch, a record of it
            trainer.metrics.write(resize.KIND, step=int(resume[1]["step"]) if resume else 0, **changed)
            log.warning("resized: %s", resize.text(changed))
    out = trainer.run(resume, stopmod.halt_at(os.environ))
    if cache:  # finished or stopped for a requeue: the next attempt starts warm
        cache.report()
        cache.save(info.is_main)
    summary = {
        "status": out.status,
        "run_dir": str(run_dir),
        "step": out.step,
        "total_steps": out.total_steps,
        "epoch": out.epoch,
        "top1": out.eval.get("top1"),
        "top5": out.eval.get("top5"),
        "val_count": out.eval.get("count"),
        "ema_top1": out.eval_ema.get("top1"),
        "train_loss": out.train_loss,
        "images_per_s": out.images_per_s,
        "data_wait": out.data_wait,
        "wall_s": out.wall_s,
        "resumed_from": out.resumed_from,
        "checkpoint": out.checkpoint,
        "world_size": info.world_size,
        "rank": info.rank,
        "config": to_dict(cfg),
        "stop_kind": out.stop_kind,
        "requeue": False,
    }
    if out.status == "preempted":
        summary["requeue"] = requeue.after_stop(summary, trainer.metrics if info.is_main else None)
    trainer.close()  # idempotent: the stack's call later does nothing more
    if info.is_main:
        log.info("\n%s", summary_table(summary))
    return summary


def write_env(run_dir: Path, rec: dict[str, Any], env: dict[str, str] | None = None) -> None:
    """env.json (this attempt's), and under an hpctrain batch script a copy per attempt that later
    ones leave alone: `attempts/env-<job>-<restart>-<attempt>.json` (a step started again on spare
    nodes runs elsewhere; each attempt's nodes and versions stay on record)."""
    env = os.environ if env is None else env
    text = json.dumps(rec, indent=1)
    (run_dir / ENV).write_text(text)
    job = env.get("SLURM_JOB_ID")
    if job and job.isdigit() and "HPCTRAIN_ATTEMPT" in env:
        d = run_dir / "attempts"
        d.mkdir(exist_ok=True)
        name = f"env-{job}-{int(env.get('SLURM_RESTART_COUNT') or 0)}-{distmod.attempt_of(env)}.json"
        (d / name).write_text(text)


def resolved_record(cfg: Config, world_size: int) -> dict[str, Any]:
    """Settings derived from the config and the job's size, kept in env.json ("resolved"): the
    learning rate the schedule peaks at, the batch each rank takes, and the steps between stop
    agreements (dist.stop_every: the plan's K, or 1 where nothing resolved it)."""
    return {
        "peak_lr": cfg.peak_lr,
        "lr_rule": lr_rule(cfg),
        "optimizer": cfg.optim.name,
        "global_batch": cfg.data.global_batch,
        "per_rank_batch": cfg.per_rank_batch(world_size),
        "world_size": world_size,
        "nodes": resize.nodes_of(os.environ),
        "accum_steps": cfg.train.accum_steps,
        "stop_every": cfg.dist.stop_every or 1,  # steps between stop agreements (plan.stop_cost, at submission)
        **(
            {"mtbf_h": cfg.ckpt.mtbf_h, "mtbf_source": mtbf_source(cfg.ckpt.mtbf_h)} if cfg.ckpt.every == "auto" else {}
        ),
    }


def finished_by_this_job(run_dir: Path, env) -> bool:
    """An attempt after the first of the Slurm job that finished the run (its `end` record says
    finished, `job.json` names this job): a requeue or in-job restart that came too late, not a user's
    new submission of a finished run (which `RunFinished` refuses)."""
    job = env.get("SLURM_JOB_ID")
    if not job or (env.get("SLURM_RESTART_COUNT", "0") in ("", "0") and env.get("HPCTRAIN_ATTEMPT", "0") in ("", "0")):
        return False
    try:
        rec = json.loads((run_dir / JOB).read_text())
    except (OSError, ValueError):
        return False
    ends = [r for r in read_metrics(run_dir / METRICS) if r.get("kind") == "end"]
    return str(rec.get("job_id")) == job and bool(ends) and ends[-1].get("status") == "finished"


def record_job(run_dir: Path, env: dict[str, str] | None = None) -> None:
    """Under Slurm, say which run this job trains, where `hpctrain status <job id>` looks: the
    run's `job.json` (jobs from plain `sbatch` have none yet) and `$HPCTRAIN_CONTROL_DIR`
    (the batch script's working directory, which sacct reports as WorkDir)."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID")
    if not job:
        return
    rec_path = run_dir / JOB
    try:
        rec = json.loads(rec_path.read_text())
    except (OSError, ValueError):
        rec = {}
    if str(rec.get("job_id")) != job:
        rec = {
            "job_id": job,
            "executor": "slurm",
            "launcher": distmod.detect(env).source,
            "nodes": env.get("SLURM_NNODES"),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        rec_path.write_text(json.dumps(rec, indent=1) + "\n")
    ctl = env.get("HPCTRAIN_CONTROL_DIR")
    if ctl:
        try:
            Path(ctl).mkdir(parents=True, exist_ok=True)
            (Path(ctl) / JOB_RECORD.format(job)).write_text(json.dumps({"job_id": job, "run_dir": str(run_dir)}) + "\n")
        except OSError as e:
            log.warning(
                "cannot write the job record under %s (%s): `hpctrain status %s` will need the run directory",
                ctl,
                e,
                job,
            )

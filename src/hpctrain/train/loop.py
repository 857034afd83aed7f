"""The training loop: DDP, AMP, accumulation, clipping, EMA, schedule, eval, checkpoints, stops.

Nothing in a step reads a value back to the host except every `log.every` steps, and no
collective outside DDP's holds a step up: the stop flags are OR-ed by an all-reduce on a CPU
(gloo) control group that is started at one agreement boundary and read at the next, every
dist.stop_every steps (train.stop, train.stop_rounds).

The Trainer's other parts live by concern in their own modules: the counters a checkpoint restores
(train.state), what a checkpoint holds and how it is written and read (train.ckpt.checkpointer), the
rollback after a non-finite value (train.health.rollback), the stop decision (train.stop_rounds) and the
injected faults (train.health.faults), both policies a caller may pass in, the eval pass
(train.eval_pass), the resume checks (train.ckpt.resume_checks), seeds and RNG state (train.seeding)
and autocast (train.amp).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as td

from hpctrain import ckpt_interval as interval
from hpctrain.config import Config
from hpctrain.data.loader import Loader
from hpctrain.errors import mark_step
from hpctrain.run.layout import LOGS, METRICS
from hpctrain.run.metrics import MetricsWriter, Progress, superseded_path
from hpctrain.train import comm, compat, fastpath, fsdp
from hpctrain.train import stop as stopmod
from hpctrain.train.amp import autocast_ctx
from hpctrain.train.ckpt import checkpoint as ckpt
from hpctrain.train.ckpt.checkpointer import Checkpointer, Layout, Parts
from hpctrain.train.ckpt.resume_checks import planned_steps
from hpctrain.train.collective import agree_max, diagnose, peer_failure
from hpctrain.train.dist import DistInfo
from hpctrain.train.eval_pass import evaluate
from hpctrain.train.health import guard, rollback, straggler
from hpctrain.train.health.faults import Faults
from hpctrain.train.health.rollback import RunDiverged
from hpctrain.train.health.watchdog import Watchdog
from hpctrain.train.mixup import Mixer, soft_cross_entropy
from hpctrain.train.observe import profiling, speed, trackers
from hpctrain.train.observe.log_window import LogWindow
from hpctrain.train.optim.build import build_optimizer, lr_schedule, warmup_steps
from hpctrain.train.optim.ema import EMA
from hpctrain.train.seeding import rng_state, seed_step, set_rng_state, step_seed
from hpctrain.train.state import TrainState
from hpctrain.train.stop_rounds import StopRounds

log = logging.getLogger("hpctrain")


@dataclass
class Outcome:
    status: str = "running"  # finished | preempted | halted | interrupted
    stop_kind: str | None = None  # preemption | time_limit | halt | interrupt (train.stop.kind_of)
    step: int = 0
    total_steps: int = 0
    epoch: int = 0
    eval: dict = field(default_factory=dict)
    eval_ema: dict = field(default_factory=dict)
    images_per_s: float = 0.0
    data_wait: float = 0.0
    train_loss: float = float("nan")
    wall_s: float = 0.0
    resumed_from: int | None = None
    checkpoint: str | None = None


@dataclass
class Loop:
    """What one `Trainer.run`'s step loop carries between its parts (`_train`, `_epoch`, `_log_window`)."""

    out: Outcome
    progress: Progress
    halt_at: int
    profile: profiling.Window | None  # log.profile_steps' window, or None
    start_wall: float
    win: LogWindow
    last_eval_step: int = -1  # the step of the last eval: the end evaluates unless it is this one


class Trainer:
    """One rank's training run. `stops` (when to stop) and `faults` (what to break, for the fault
    tests) are policies: by default from `stop_flag` and from the environment."""

    def __init__(
        self,
        cfg: Config,
        dist: DistInfo,
        device: torch.device,
        run_dir: Path | None,
        train_loader: Loader,
        val_loader: Loader | dict[str, Loader] | None,
        model: torch.nn.Module,
        control_group=None,
        stop_flag: stopmod.StopFlag | None = None,
        stops: StopRounds | None = None,
        faults: Faults | None = None,
    ):
        self.cfg, self.dist, self.device, self.run_dir = cfg, dist, device, run_dir
        self.train_loader = train_loader
        # {split: loader} (data.build.build_eval_loaders), or one loader / None for the headline split alone
        self.eval_loaders = (
            dict(val_loader)
            if isinstance(val_loader, dict)
            else ({} if val_loader is None else {cfg.data.eval_splits[0]: val_loader})
        )
        self.val_loader = next(iter(self.eval_loaders.values()), None)  # the headline split's (listed first)
        self.model = model.to(device)
        fastpath.apply(cfg.train, device)
        self.control_group = control_group
        # a StopFlag not installed is never set unless a caller's is
        self.stops = stops or StopRounds(stop_flag or stopmod.StopFlag(), control_group, cfg.dist.stop_every or 1)
        self.faults = faults or Faults.from_env(dist.rank)
        t = cfg.train
        self.accum = t.accum_steps
        self.steps_per_epoch = len(train_loader) // self.accum
        if self.steps_per_epoch == 0:
            raise ValueError(
                "the train loader has fewer batches than train.accum_steps: lower data.global_batch or "
                "train.accum_steps"
            )
        self.total_steps = planned_steps(cfg, len(train_loader))
        self.warmup = warmup_steps(cfg, self.steps_per_epoch)
        self.lr_of = lr_schedule(cfg, self.steps_per_epoch, self.total_steps)
        self.fsdp = cfg.dist.parallel == "fsdp"  # on one rank too: a one-GPU FSDP run (or benchmark) runs FSDP
        if self.fsdp and not td.is_initialized():
            raise RuntimeError(
                "dist.parallel=fsdp shards over a process group, a world of 1 too: "
                "call train.collective.init(..., group_of_one=True) before the Trainer"
            )
        if self.fsdp:  # train.ema is refused with fsdp when the config loads (TrainConfig.validate)
            fsdp.shard(self.model, device, cfg.dist.fsdp_reshard, t.amp, cfg.dist.grad_reduce_dtype)
        # bf16 under FSDP is FSDP's mixed-precision policy (train.fsdp), so no autocast in steps
        self.step_amp = "none" if self.fsdp and t.amp == "bf16" else t.amp
        self.optimizer = build_optimizer(cfg, self.model, device)
        self.scaler = compat.grad_scaler(device) if t.amp == "fp16" else None
        self.ema = EMA(self.model, t.ema) if t.ema > 0 else None
        self.mixer = Mixer(
            cfg.model.num_classes,
            cfg.aug.label_smoothing,
            cfg.aug.mixup,
            cfg.aug.cutmix,
            cfg.aug.mix_prob,
            cfg.aug.switch_prob,
            t.seed,
        )
        self.fwd_model = self.model
        if cfg.compile.enabled:
            self.fwd_model = torch.compile(self.model, mode=None if cfg.compile.mode == "default" else cfg.compile.mode)
        self.ddp = None
        self.reduce_hook: comm.CountingHook | None = None
        if dist.world_size > 1 and cfg.dist.parallel == "ddp":
            self.ddp, self.reduce_hook = comm.wrap(self.fwd_model, device, cfg)
            self.fwd_model = self.ddp
        self.train_state = TrainState()
        self.finite = guard.FiniteFlag(device)  # OR of "not finite" since the last clean check, on the device
        self.spikes = guard.SpikeWatch(cfg.health.spike_factor, cfg.health.spike_window)
        self.grad_norm = torch.zeros((), device=device)  # the last step's total gradient norm (before clipping)
        self.auto = (
            interval.AutoInterval(
                cfg.ckpt.auto_first,
                cfg.ckpt.mtbf_h or interval.DEFAULT_MTBF_H,
                interval.mtbf_source(cfg.ckpt.mtbf_h),
            )
            if cfg.ckpt.every == "auto"
            else None
        )  # ckpt.every=auto: when the next save is due
        self.clock = interval.StepClock()  # training seconds per step (saves and evals left out)
        self.paused_s = 0.0  # seconds of saves and evals in the current log window
        self.started = (0, time.perf_counter())  # (step, time) training last (re)started at
        main_dir = run_dir if dist.is_main else None
        self.metrics = MetricsWriter(main_dir and main_dir / METRICS, sink=trackers.open_sink(cfg, main_dir))
        self.speed = speed.SpeedMeter(cfg, dist.world_size, device)
        self.fwd_clock = straggler.Clock(device, dist.world_size > 1, self.faults.compute_delay)
        self.stragglers = straggler.StragglerWatch(
            dist.rank,
            dist.world_size,
            dist.local_rank,
            control_group,
            round(cfg.health.straggler_frac * 100, 9),  # the detector counts percent of a step
            self.metrics,
            round(cfg.health.exclude_straggler_frac * 100, 9),
        )
        self.watchdog = Watchdog(
            cfg.hang_s,
            dist.rank,
            dist.world_size,
            run_dir / LOGS if run_dir else None,
            nccl=td.is_initialized() and td.get_backend() == "nccl",
            report=lambda kind, rec: self.metrics.write(kind, **rec),
            local_rank=dist.local_rank,  # local rank 0 writes its node's heartbeats (issue 55)
        )
        self.ckpts = Checkpointer(
            cfg,
            dist,
            device,
            run_dir,
            control_group,
            self.metrics,
            Parts(self.model, self.optimizer, self.ema, self.scaler, self.train_state),
            Layout(self.steps_per_epoch, self.accum, self.fsdp),
            self._schedule,
        )

    @property
    def step(self) -> int:
        """The optimizer steps taken (`train_state.step`; benchmarks and tests step it by hand)."""
        return self.train_state.step

    @step.setter
    def step(self, value: int) -> None:
        self.train_state.step = value

    def _schedule(self) -> dict:
        """The learning-rate schedule as a checkpoint records it."""
        return {"peak_lr": self.cfg.peak_lr, "warmup": self.warmup, "total": self.total_steps}

    def state(self) -> dict:
        """The single-file checkpoint of this step (train.ckpt.checkpointer)."""
        return self.ckpts.full_state()

    def load_state(self, st: dict, path: Path) -> None:
        """Restore a checkpoint read from `path` (train.ckpt.checkpointer)."""
        self.ckpts.load(st, path)

    def save(self, background: bool = False) -> str | None:
        """Checkpoint this step, on every rank (train.ckpt.checkpointer)."""
        return self.ckpts.save(background)

    def _checkpoint(self, out: Outcome, stopping: bool = False) -> None:
        """Save at this step unless that is done: a stop on a `ckpt.every` step writes one file.
        The `ckpt.every` saves may go to the background; the last one and a stop's never do.
        Never from a state that saw a non-finite value: then a stop saves nothing (the run resumes
        from its last good checkpoint), anything else raises guard.Diverged (roll back or stop)."""
        periodic = self._ckpt_due()
        if self.train_state.last_saved_step == self.step:
            if periodic and self.auto:  # on disk already: the next auto save one interval on, not every step
                self.auto.start(self.step)
            return
        if not self._healthy(check_weights=True):
            if not stopping:
                raise guard.Diverged(self.step, guard.Reason.NONFINITE, {"where": "before a checkpoint"})
            self.metrics.write(
                "nonfinite",
                step=self.step,
                reason=guard.Reason.NONFINITE.value,
                where="before a stop's checkpoint",
                action="no checkpoint",
            )
            log.warning(
                "step %d saw a non-finite value: no checkpoint at this stop (the last good one stays)", self.step
            )
            return
        t0 = time.perf_counter()
        out.checkpoint = self.save(background=periodic) or out.checkpoint
        save_s = time.perf_counter() - t0
        self.paused_s += save_s
        if periodic and self.auto:
            self._auto_interval(save_s)

    def _start_clock(self) -> None:
        """Training (re)starts at this step (a start, a resume, a rollback): the step time is measured
        anew, and ckpt.every=auto's next save comes ckpt.auto_first steps on (or one interval
        on, once measured)."""
        self.clock.reset()
        self.paused_s = 0.0
        self.started = (self.step, time.perf_counter())
        if self.auto:
            self.auto.start(self.step)

    def _ckpt_due(self) -> bool:
        """A periodic checkpoint is due at this step (ckpt.every: steps, or auto's next step)."""
        every = self.cfg.ckpt.every
        if self.step >= self.total_steps or not every:
            return False
        return self.auto.due(self.step) if self.auto else self.step % every == 0

    def _auto_interval(self, save_s: float) -> None:
        """ckpt.every=auto after a periodic save that took `save_s`: the next due step, from the
        slowest rank's save and step times (every rank must save at the same steps); a new interval is
        a `ckpt_interval` record and a line in rank 0's log."""
        step_s = self.clock.step_s() or (time.perf_counter() - self.started[1]) / max(1, self.step - self.started[0])
        save_s, step_s = agree_max([save_s, step_s], self.control_group)
        rec = self.auto.saved(self.step, save_s, step_s)
        if rec is None:
            return
        self.metrics.write("ckpt_interval", step=self.step, **rec)
        if self.dist.is_main:
            log.info(
                "checkpoint interval: every %d steps (%.0f s) = sqrt(2 x save %.2f s x MTBF %.3g h, %s) / step "
                "%.3g s; next at step %d",
                rec["interval_steps"],
                rec["interval_s"],
                save_s,
                rec["mtbf_h"],
                rec["mtbf_source"],
                step_s,
                rec["next_step"],
            )

    def _healthy(self, check_weights: bool = False) -> bool:
        """Every rank agrees that no loss or gradient norm since the last check was non-finite (and,
        with `check_weights`, no parameter is): one all-reduce of a flag, where the loop syncs anyway."""
        bad = self.finite.bad
        if check_weights:
            bad = bad | ~guard.params_finite(self.model)
        flag = bad.to(torch.int32).reshape(1)
        if td.is_initialized():
            td.all_reduce(flag, op=td.ReduceOp.MAX)
        return not bool(flag.item())

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, model: torch.nn.Module) -> dict:
        """Exact top-1/top-5 over the whole val set (`train.eval_pass.evaluate`, shared with `hpctrain eval`)."""
        return evaluate(model, self.val_loader, self.cfg.train.amp, self.device)

    def eval_record(self, model: torch.nn.Module, prefix: str = "") -> tuple[dict, dict]:
        """(the headline split's results, the record fields): with one split its results under their
        names (`top1`...), as ever; with several, also every split's under `<split>/<prefix><name>`
        (TensorBoard `eval/<split>/top1`), each split evaluated once."""
        results = {
            split: evaluate(model, loader, self.cfg.train.amp, self.device)
            for split, loader in self.eval_loaders.items()
        }
        head = next(iter(results.values()), {})
        fields = {f"{prefix}{k}": v for k, v in head.items()}
        if len(self.cfg.data.eval_splits) > 1:
            for split, res in results.items():
                fields.update({f"{split}/{prefix}{k}": v for k, v in res.items()})
        return head, fields

    # ------------------------------------------------------------------ training

    def train_step(self, batches) -> torch.Tensor:
        """One optimizer step over `accum` micro-batches; returns the mean loss (on device)."""
        lr = self.lr_of(self.step)
        for g in self.optimizer.param_groups:  # lr_scale: layer-wise decay and head multiplier (train/optim/build.py)
            g["lr"] = lr * g["lr_scale"] if "lr_scale" in g else lr
        total = torch.zeros((), device=self.device)
        for i, (images, labels) in enumerate(batches):
            images, targets = self.mixer(images, labels, self.step, i, self.dist.rank)
            sync = self.ddp is None or i == self.accum - 1
            if self.fsdp and self.accum > 1:
                self.model.set_requires_gradient_sync(i == self.accum - 1)
            with contextlib.nullcontext() if sync else self.ddp.no_sync():
                with autocast_ctx(self.step_amp, self.device):
                    self.fwd_clock.start()
                    logits = self.fwd_model(images)
                    self.fwd_clock.stop()
                loss = soft_cross_entropy(logits, targets) / self.accum
                loss = self.faults.loss(loss, self.step, i)  # as it is, unless a fault is injected
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            total += loss.detach()
        # the total gradient norm of every step, before clipping: clip_grad_norm_'s, or the same norm read
        # without clipping (the gradients untouched); a device scalar, read at the log boundary like the loss.
        # Under fp16 the gradients are unscaled first (GradScaler.step then does not unscale them again)
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.cfg.optim.clip_grad > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.clip_grad)
            self.grad_norm = compat.full_norm(norm)
        else:
            self.grad_norm = compat.grad_total_norm(self.model.parameters())
        # no host sync: a flag on the device, read at the log boundary and before a save (train/health/guard.py);
        # under fp16 an infinite gradient norm is the GradScaler's to skip, so only the loss counts there
        self.finite.update(total if self.scaler else total + self.grad_norm)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema:
            self.ema.update(self.model)
        return total

    def run(self, resume: tuple[Path, dict] | None = None, halt_at: int = 0) -> Outcome:
        """Train to the end (or to a stop); a failed collective is reported with the stuck ranks. An
        error that leaves carries the step it stopped in (errors.mark_step), which the task's crash
        line gives the batch shell: the same error at the same step after a restart is a bug."""
        try:
            return self._run_reported(resume, halt_at)
        except Exception as e:
            mark_step(e, self.step + 1)  # the step it was taking
            raise

    def _run_reported(self, resume: tuple[Path, dict] | None, halt_at: int) -> Outcome:
        try:
            with self.watchdog:  # a hang: stacks, the stuck ranks named, the process exits (train.health.watchdog)
                out = self._run(resume, halt_at)
            out.checkpoint = self.ckpts.collect() or out.checkpoint  # a stop on a ckpt.every step: its save
            return out
        except (RuntimeError, td.DistError) as e:
            if isinstance(e, RunDiverged):  # unanimous, and said in one line
                raise
            if isinstance(e, ckpt.CheckpointError):  # unanimous (Trainer.save): every rank is here
                self.stops.settle()
                self.stragglers.settle()
            if self.dist.world_size == 1 or not td.is_initialized() or isinstance(e, ckpt.CheckpointError):
                raise
            if not peer_failure(e):
                raise
            raise diagnose(e, self.dist.rank, self.dist.world_size, min(30.0, self.cfg.dist.pg_timeout_s)) from e
        finally:
            self.speed.close()

    def close(self) -> None:
        """End everything of this run that still talks to a process group or runs a thread, in
        order, so that `destroy_process_group` (collective.shutdown, last) can free every group while the
        interpreter is alive (docs/communication.md, "Exit"): the background checkpoint (a thread
        with collectives on its own group), the stop round and the straggler round (async
        all-reduces on the control group), the hang watchdog and NVML threads, the metrics files;
        then the DDP/FSDP wrappers, optimizer and EMA, which hold the groups. A group a wrapper
        still holds outlives `destroy_process_group` with its gloo threads, and is freed at
        interpreter exit, where a gloo worker that drops the last reference to a Python tensor
        needs the GIL and is ended mid-C++ (std::terminate: "terminate called without an active
        exception", SIGABRT). Idempotent; the trainer cannot train afterwards."""
        self.ckpts.close()
        self.stops.close()
        self.stragglers.settle()
        self.watchdog.stop()
        self.speed.close()
        self.metrics.close()
        self.ddp = self.fwd_model = self.model = self.optimizer = self.ema = None
        self.reduce_hook = self.control_group = None

    def _run(self, resume: tuple[Path, dict] | None = None, halt_at: int = 0) -> Outcome:
        out = Outcome(total_steps=self.total_steps)
        if resume:
            self.load_state(resume[1], resume[0])
            out.resumed_from = self.step
            log.info("resumed from %s at step %d", resume[0], self.step)
        self._supersede_records()
        self.stragglers.open()
        self.speed.open(sample_gpus=self.dist.is_main)
        progress = Progress(self.total_steps, self.dist.is_main)
        self.model.train()
        start_wall = time.perf_counter()
        last_eval_step = -1
        if self.ddp is not None and self.step < self.total_steps:
            if self.cfg.compile.enabled and self.cfg.compile.warmup:
                self._warm_compile()
            self._settle_ddp_buckets()
        if self.device.type == "cuda" and self.step < self.total_steps:
            self._log_attention_kernel()
        bits = self.stops.at_start(self.step, halt_at) if self.step < self.total_steps else 0
        if bits:  # a signal during start-up: nothing trained since the checkpoint we resumed from
            return self._stop(out, bits, start_wall, save=False)
        if self.step < self.total_steps:  # the first round, read dist.stop_every steps on
            self.stops.start(self.step)
        if self.train_state.eval_pending:  # the last attempt stopped where an epoch's eval was due
            self._eval_and_log(out, progress)
            last_eval_step = self.step
        # log.profile_steps / memory_snapshot_steps (train.observe.profiling); None, and nothing built, when off
        window = profiling.open_window(
            self.cfg.log, self.dist.rank, self.dist.world_size, self.run_dir, self.device, self.step
        )
        try:
            return self._train(Loop(out, progress, halt_at, window, start_wall, LogWindow(self.device), last_eval_step))
        finally:
            if window:
                window.close()

    def _train(self, lp: Loop) -> Outcome:
        """The step loop of `_run`, from its first step to the end (or a stop): epochs of steps, and
        after a rollback the same again from the checkpoint's step."""
        lp.win.reset()
        self._start_clock()
        while True:
            try:
                while self.step < self.total_steps:
                    stopped = self._epoch(lp)
                    if stopped:
                        return stopped
                lp.progress.newline()
                self.stops.settle()  # nothing is in flight after the last step; never leave one behind
                self.stragglers.settle()
                if not self._healthy():  # the last log boundary read it; a last check before eval and save
                    raise guard.Diverged(self.step, guard.Reason.NONFINITE, {"where": "at the end"})
                if lp.last_eval_step != self.step:
                    self._eval_and_log(lp.out, lp.progress)
                self._checkpoint(lp.out)
                break
            except guard.Diverged as e:  # every rank, at the same step (an agreed value)
                lp.progress.newline()
                self._rollback(e)
                lp.win.reset()
                self._start_clock()
                lp.last_eval_step = -1
                if self.train_state.eval_pending:  # the checkpoint ended an epoch whose eval had not run then
                    self._eval_and_log(lp.out, lp.progress)
                    lp.last_eval_step = self.step
        return self._finish(lp)

    def _epoch(self, lp: Loop) -> Outcome | None:
        """The steps left in the loader's current epoch (the state says where it is); the Outcome of a
        stop, else None."""
        t = self.cfg.train
        epoch, pos = self.train_state.loader_position(self.steps_per_epoch)
        self.train_loader.set_epoch(epoch, pos * self.accum)
        it = iter(self.train_loader)
        for _ in range(pos, self.steps_per_epoch):
            if self.step >= self.total_steps:
                break
            if lp.profile:
                lp.profile.before(self.step + 1)
            t0 = time.perf_counter()
            batches = [next(it) for _ in range(self.accum)]
            self.faults.data_wait()  # returns at once, unless a slow data path is injected
            wait = time.perf_counter() - t0
            seed_step(step_seed(t.seed, self.step, self.dist.rank), self.device)
            lp.win.add(self.train_step(batches), self.grad_norm, wait)
            self.step += 1
            if lp.profile:
                lp.profile.after(self.step, wait)
            self.watchdog.beat(self.step)
            self.train_state.eval_pending = self._eval_due()
            if self.step % self.cfg.log.every == 0 or self.step == self.total_steps:
                self._log_window(lp)
            if self._ckpt_due():
                self._checkpoint(lp.out)
            bits = self.stops.at_boundary(self.step, self.total_steps, lp.halt_at, bool(self.stragglers.exclude))
            if bits and self.step < self.total_steps:
                lp.progress.newline()
                if lp.profile:  # its trace ends here, without the stop's checkpoint
                    lp.profile.close()
                return self._stop(lp.out, bits, lp.start_wall, save=True)
            if self.train_state.eval_pending and self.train_state.loader_position(self.steps_per_epoch)[1]:
                # an epoch of steps ended inside the loader's epoch (a rollback skipped batches)
                self._eval_and_log(lp.out, lp.progress)
                lp.last_eval_step = self.step
        del it
        if self.train_state.eval_pending:
            self._eval_and_log(lp.out, lp.progress)
            lp.last_eval_step = self.step
        return None

    def _log_window(self, lp: Loop) -> None:
        """A log boundary: the window's one sync (`_window`), its `train` record and progress line,
        then a new window."""
        win, out = lp.win, lp.out
        loss, grad_norm = self._window(*win.means())
        el = win.elapsed()
        self.clock.add(win.steps, max(0.0, el - self.paused_s))
        self.paused_s = 0.0
        ips = self.cfg.data.global_batch * win.steps / max(el, 1e-9)
        lr = self.lr_of(self.step - 1)  # the schedule's, before any group's lr_scale
        rec = dict(
            step=self.step,
            epoch=self.step / self.steps_per_epoch,
            loss=loss,
            lr=lr,
            images_per_s=ips,
            data_wait=win.wait / max(el, 1e-9),
            **self.speed.fields(ips, el / win.steps),
        )
        rec["grad_norm"] = grad_norm  # the window's mean, before clipping
        self.stragglers.post(
            self.step, el / win.steps, win.wait / win.steps, (win.wait + self.fwd_clock.take()) / win.steps
        )
        skipped = len(self.train_loader.skipped)
        if skipped:
            rec["skipped_samples"] = skipped
        if self.reduce_hook:  # per rank and step, in the dtype on the wire
            rec["grad_reduce_bytes"] = self.reduce_hook.take() // win.steps
        if self.dist.world_size > 1:  # per step: the stop rounds' part that outlasted their K steps
            rec["stop_wait_s"] = self.stops.take_wait() / win.steps
        self.metrics.write("train", **rec)
        lp.progress.update(
            self.step,
            f"loss {loss:.4f} lr {lr:.2e} {ips:.0f} img/s "
            f"data {100 * rec['data_wait']:.0f}%" + speed.progress_text(rec),
        )
        out.train_loss, out.images_per_s, out.data_wait = loss, ips, rec["data_wait"]
        win.reset()

    def _finish(self, lp: Loop) -> Outcome:
        """The run reached its last step: the Outcome, and the `end` record."""
        out = lp.out
        out.status, out.step = "finished", self.step
        out.epoch = self.step // self.steps_per_epoch
        out.wall_s = time.perf_counter() - lp.start_wall
        if lp.win.total_steps:
            out.data_wait = lp.win.total_wait / max(out.wall_s, 1e-9)
        self.metrics.write(
            "end",
            step=self.step,
            status=out.status,
            wall_s=out.wall_s,
            top1=out.eval.get("top1"),
            top5=out.eval.get("top5"),
        )
        self.metrics.close()
        return out

    def _stop(self, out: Outcome, bits: int, start_wall: float, save: bool) -> Outcome:
        """Checkpoint at this step (every rank takes part) and end the run as stopped."""
        self.stops.settle()  # every path out waits for its round (none is in flight here)
        self.stragglers.settle()
        if save:
            self._checkpoint(out, stopping=True)  # once per step; with eval_pending the resumed run evaluates first
        self.stops.flag.log_new()  # a signal that reached this rank after another rank's stop was agreed
        out.stop_kind = stopmod.kind_of(bits)
        out.status = {"halt": "halted", "interrupt": "interrupted"}.get(out.stop_kind, "preempted")
        out.step, out.epoch = self.step, self.step // self.steps_per_epoch
        out.wall_s = time.perf_counter() - start_wall
        self.metrics.write("stop", step=self.step, reason=out.status, stop_kind=out.stop_kind)
        log.warning(
            "stopped at step %d (%s)%s",
            self.step,
            out.stop_kind,
            f"; checkpoint {out.checkpoint}" if save and out.checkpoint else "",
        )
        return out

    def _rollback(self, e: guard.Diverged) -> None:
        """Back to the last good checkpoint, or stop with RunDiverged (train.health.rollback): the rounds in
        flight settled first, the non-finite flag cleared and the replayed records moved after."""
        self.stops.settle()  # the round posted at the last boundary: none may stay in flight
        self.stragglers.settle()
        path, skip = rollback.restore(e, self.ckpts, self.train_state, self.cfg.health, self.metrics)
        self.finite.clear()
        self._supersede_records()
        rollback.report(e, path, skip, self.train_state, self.cfg.health, self.metrics)
        if self.step < self.total_steps:
            self.stops.start(self.step)

    def _eval_due(self) -> bool:
        """This step ends an epoch that `train.eval_every_epochs` evaluates (the last step has its own)."""
        ep, pos = divmod(self.step, self.steps_per_epoch)
        every = self.cfg.train.eval_every_epochs
        return pos == 0 and every > 0 and ep % every == 0 and self.step < self.total_steps

    def _supersede_records(self) -> None:
        """Rank 0: move what an earlier attempt logged past this start out of metrics.jsonl, since
        this run logs it again (the pending eval at this step included); one timeline per file."""
        start, pending = self.step, self.train_state.eval_pending

        def replayed(rec: dict) -> bool:
            step = rec.get("step")
            if not isinstance(step, (int, float)) or rec.get("kind") in ("nonfinite", "rollback"):
                return False  # events, not the timeline: a later start keeps them
            return step > start or (pending and step == start and rec.get("kind") == "eval")

        moved = self.metrics.supersede(replayed)
        if moved:
            log.info(
                "moved %d metric lines an earlier attempt wrote past step %d to %s",
                moved,
                start,
                superseded_path(self.metrics.path).name,
            )

    def _log_attention_kernel(self) -> None:
        """Say which SDPA kernel attention runs on: flash or cuDNN expected, math is the slow path."""
        size = self.cfg.model.img_size
        x = torch.zeros(2, 3, size, size, device=self.device)  # no RNG drawn: eval-mode forward
        kind = fastpath.sdpa_backend_used(self.model, x, autocast_ctx(self.cfg.train.amp, self.device))
        if "math" in kind:
            log.warning(
                "attention runs on the math SDPA kernel (slow): check train.sdpa_backend, "
                "train.amp and the head dimension"
            )
        else:
            log.info("attention kernel: %s", kind)

    def _warm_compile(self) -> None:
        """compile.enabled under DDP: compile before the first collective, then wait for every rank.

        Inductor compiles at the first call, and the backward at the first backward (AOTAutograd
        lowers it lazily): unwarmed, that is inside DDP's first backward, whose all-reduces hold the
        fast ranks until the slowest rank's compile ends, past dist.pg_timeout_s on many cold ranks.
        So one forward + backward runs here under `no_sync` (inside DDP's forward, so DDPOptimizer
        splits the graph as in a step; no all-reduce, no bucket rebuild), on the input
        `_settle_ddp_buckets` uses, with every RNG stream, every gradient and the optimizer left as
        they were; then a `monitored_barrier` on the gloo control group waits up to
        compile.timeout_s, not the process-group timeout (docs/communication.md).
        """
        if self.ddp.static_graph:  # no_sync breaks static_graph (pytorch/pytorch#143580): compile in a step
            log.warning("compile.warmup skipped: DDP static_graph is on (dist.ddp_static_graph=always)")
            return
        t0 = time.perf_counter()
        rng = rng_state(self.device)
        params = list(self.model.parameters())
        grads = [p.grad for p in params]
        for p in params:  # a backward accumulates into an existing gradient: start from none
            p.grad = None
        with self.ddp.no_sync():
            with autocast_ctx(self.step_amp, self.device):
                out = self.fwd_model(self._throwaway_input())
            (out.float().sum() * 0.0).backward()
        for p, g in zip(params, grads):
            p.grad = g
        set_rng_state(rng, self.device)
        warm_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        timeout = self.cfg.compile.timeout_s
        if td.get_backend(self.control_group) != "gloo":  # no gloo control group (not from train.entry)
            log.warning("compile.warmup: no gloo control group to wait on; the first step waits instead")
            return
        try:
            td.monitored_barrier(self.control_group, timeout=datetime.timedelta(seconds=timeout))
        except RuntimeError as e:
            raise RuntimeError(
                f"a rank did not finish its first torch.compile within compile.timeout_s="
                f"{timeout} ({str(e).splitlines()[0]}): raise compile.timeout_s, or warm "
                "compile.cache with a short run"
            ) from e
        log.info(
            "torch.compile warm-up: %.1f s here, then %.1f s waiting for the other ranks",
            warm_s,
            time.perf_counter() - t1,
        )

    def _throwaway_input(self) -> torch.Tensor:
        """Zeros shaped like one micro-batch of this rank: what the warm-up and bucket settling run on."""
        b = self.cfg.per_rank_batch(self.dist.world_size)
        return torch.zeros(b, 3, self.cfg.model.img_size, self.cfg.model.img_size, device=self.device)

    def _settle_ddp_buckets(self) -> None:
        """Throwaway backwards before the first real step, at every start or resume, until DDP has
        rebuilt its gradient buckets.

        DDP starts with all parameters in one bucket and re-lays them out (in gradient-ready order,
        a small first bucket) once, after the first backward that records that order: the 1st
        without static_graph, the 2nd with it (its 1st only counts hooks and all-reduces at the
        end). With more than 2 ranks the layout decides the order of each sum (its last bits), so
        every real step, resumed or not, must see the rebuilt layout (docs/checkpoints.md). The
        gradients are discarded; nothing else (RNG, optimizer, step) changes.
        """
        rng = torch.get_rng_state()
        x = self._throwaway_input()
        for _ in range(3):  # 1 or 2 are needed; a 3rd that still rebuilds nothing is reported below
            with autocast_ctx(self.cfg.train.amp, self.device):
                out = self.fwd_model(x)
            (out.float().sum() * 0.0).backward()
            self.optimizer.zero_grad(set_to_none=True)
            if self.ddp.reducer._rebuild_buckets():  # what DDP's next forward would do; True once
                break
        else:
            log.warning(
                "DDP did not rebuild its gradient buckets in 3 throwaway backwards: a resume "
                "with more than 2 ranks may not be bit-exact"
            )
        torch.set_rng_state(rng)
        if self.reduce_hook:
            self.reduce_hook.take()  # its buckets are not a step's

    def _window(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> tuple[float, float]:
        """The log boundary's one sync: (mean loss over every rank, mean gradient norm) of the window.
        The non-finite flag rides in the same all-reduce, so every rank raises guard.Diverged alike
        on a non-finite value, or on a spike of the agreed loss (health.spike_factor)."""
        v = torch.stack([loss.float(), grad_norm.float(), self.finite.bad.float()])
        if td.is_initialized():
            td.all_reduce(v)
            v[:2] /= self.dist.world_size
        mean, gn, bad = v.tolist()
        if bad or not math.isfinite(mean):
            raise guard.Diverged(self.step, guard.Reason.NONFINITE, {"loss": mean, "grad_norm": gn})
        median = self.spikes.check(mean)
        if median is not None:
            raise guard.Diverged(
                self.step, guard.Reason.SPIKE, {"loss": mean, "median": median, "factor": self.cfg.health.spike_factor}
            )
        st = self.train_state
        st.good_step = st.last_saved_step  # a clean check after it: known good, kept by pruning
        return mean, gn

    def _eval_and_log(self, out: Outcome, progress: Progress) -> None:
        progress.newline()
        t0 = time.perf_counter()
        out.eval, fields = self.eval_record(self.model)
        rec = {"step": self.step, "epoch": self.step / self.steps_per_epoch, **fields}
        if self.ema:
            out.eval_ema, fields = self.eval_record(self.ema.module, "ema_")
            rec.update(fields)
        self.metrics.write("eval", **rec)
        self.paused_s += time.perf_counter() - t0  # not training time (StepClock); a best-eval save counts itself
        st = self.train_state
        st.eval_pending = False
        top1 = out.eval.get("top1")
        if self.cfg.ckpt.keep_best and top1 is not None and (st.best is None or top1 > st.best[0]):
            st.best = (top1, self.step)  # every rank: the eval is summed over all of them
            self._checkpoint(out)  # this step's state, kept by pruning until a better eval
        if self.dist.is_main and len(self.eval_loaders) > 1:
            for split in self.eval_loaders:
                log.info(
                    "eval step %d on %s: top-1 %.2f%% top-5 %.2f%% (%d images)",
                    self.step,
                    split,
                    rec[f"{split}/top1"],
                    rec[f"{split}/top5"],
                    rec[f"{split}/count"],
                )
        elif self.dist.is_main and out.eval:
            log.info(
                "eval step %d: top-1 %.2f%% top-5 %.2f%% (%d images)",
                self.step,
                out.eval["top1"],
                out.eval["top5"],
                out.eval["count"],
            )

"""The training loop: DDP, AMP, accumulation, clipping, EMA, schedule, eval, checkpoints, stops.

Nothing in a step reads a value back to the host except every `log.every` steps, and no
collective outside DDP's holds a step up: the stop flags are OR-ed by an all-reduce on a CPU
(gloo) control group that is started at one agreement boundary and read at the next, every
dist.stop_every steps (train.stop, train.stop_rounds).

The Trainer's other parts live by concern in their own modules and are handed to it (build_trainer):
the model in its wrappers, the optimizer, scaler, EMA and mixer (train.parts), the counters a checkpoint
restores and the Outcome (train.state), what a checkpoint holds and how it is written and read
(train.ckpt.checkpointer) and when one is due (train.ckpt.cadence), the evals (train.evaluator), the
non-finite and spike checks (train.health.guard) and the rollback after one (train.health.rollback),
the start-up warm-ups (train.warmup), the stop decision (train.stop_rounds) and the injected faults
(train.health.faults), both policies a caller may pass in, the resume checks (train.ckpt.resume_checks),
seeds and RNG state (train.seeding) and autocast (train.amp).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as td

from hpctrain.config import Config
from hpctrain.data import sampling
from hpctrain.data.loader import Loader
from hpctrain.errors import mark_step
from hpctrain.run import goodput, startup
from hpctrain.run.layout import METRICS, SAMPLE_HASHES
from hpctrain.run.metrics import MetricsWriter, Progress, superseded_path
from hpctrain.train import compat, warmup
from hpctrain.train import stop as stopmod
from hpctrain.train.amp import autocast_ctx
from hpctrain.train.ckpt import checkpoint as ckpt
from hpctrain.train.ckpt.cadence import Cadence
from hpctrain.train.ckpt.checkpointer import Checkpointer, Layout, Parts
from hpctrain.train.collective import diagnose, peer_failure
from hpctrain.train.dist import DistInfo
from hpctrain.train.evaluator import Evaluator
from hpctrain.train.health import guard, rollback, straggler
from hpctrain.train.health.faults import Faults
from hpctrain.train.health.rollback import RunDiverged
from hpctrain.train.health.watchdog import Watchdog
from hpctrain.train.mixup import soft_cross_entropy
from hpctrain.train.observe import profiling, speed, trackers
from hpctrain.train.observe.log_window import LogWindow
from hpctrain.train.observe.sample_hashes import SampleHashes
from hpctrain.train.parts import StepPlan, TrainParts, build_parts
from hpctrain.train.seeding import seed_step, step_seed
from hpctrain.train.state import Outcome, TrainState
from hpctrain.train.stop_rounds import StopRounds

log = logging.getLogger("hpctrain")


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
    started: bool = False  # this process took its first step (the `startup` record is written)


class Trainer:
    """One rank's training run, given its parts (build_trainer builds them). `stops` (when to stop)
    and `faults` (what to break, for the fault tests) are policies; faults by default the environment's."""

    def __init__(
        self,
        cfg: Config,
        dist: DistInfo,
        device: torch.device,
        run_dir: Path | None,
        parts: TrainParts,
        loaders: tuple[Loader, Loader | dict[str, Loader] | None],
        stops: StopRounds,
        control_group=None,
        faults: Faults | None = None,
    ):
        self.cfg, self.dist, self.device, self.run_dir, self.control_group = cfg, dist, device, run_dir, control_group
        p = parts
        self.model, self.fwd_model, self.ddp, self.reduce_hook = p.model, p.fwd_model, p.ddp, p.reduce_hook
        self.optimizer, self.scaler, self.ema, self.mixer = p.optimizer, p.scaler, p.ema, p.mixer
        self.fsdp, self.step_amp, self.train_loader = p.fsdp, p.step_amp, loaders[0]
        pl = StepPlan.of(cfg, len(self.train_loader))
        self.accum, self.steps_per_epoch, self.total_steps = pl.accum, pl.steps_per_epoch, pl.total_steps
        self.warmup, self.lr_of = pl.warmup, pl.lr_of
        self.stops = stops
        self.faults = faults or Faults.from_env(dist.rank)
        self.train_state = TrainState()
        self.guard = guard.Guard(device, cfg.health.spike_factor, cfg.health.spike_window, dist.world_size)
        # b_r·W/g on this rank's loss where the ranks' shares of a micro-step are uneven (data.sampling), so
        # DDP's/FSDP's equal-weight average is the micro-step's mean; None (left as it is) when they are even
        self.loss_weight = sampling.loss_weight(cfg.micro_batch, dist.rank, dist.world_size)
        self.grad_norm = torch.zeros((), device=device)  # the last step's total gradient norm (before clipping)
        main_dir = run_dir if dist.is_main else None
        self.metrics = MetricsWriter(main_dir and main_dir / METRICS, sink=trackers.open_sink(cfg, main_dir))
        self.hashes = (
            SampleHashes(cfg.train.seed, device, dist.world_size, main_dir and main_dir / SAMPLE_HASHES)
            if cfg.log.sample_hashes
            else None
        )
        self.cadence = Cadence(cfg.ckpt, self.metrics, control_group, dist.is_main)
        self.evaluator = Evaluator(cfg, device, loaders[1], self.metrics, dist.is_main)
        self.speed = speed.SpeedMeter(cfg, dist.world_size, device)
        self.fwd_clock = straggler.Clock(device, dist.world_size > 1, self.faults.compute_delay)
        self.stragglers = straggler.StragglerWatch.for_run(cfg.health, dist, control_group, self.metrics)
        self.watchdog = Watchdog.for_run(cfg.hang_s, dist, run_dir, lambda kind, rec: self.metrics.write(kind, **rec))
        state = Parts(self.model, self.optimizer, self.ema, self.scaler, self.train_state)
        layout = Layout(self.steps_per_epoch, self.accum, self.fsdp)
        self.ckpts = Checkpointer(
            cfg, dist, device, run_dir, control_group, self.metrics, state, layout, self._schedule
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
            self.cadence.on_disk(self.step, periodic)
            return
        if not self.guard.healthy(self.model):
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
        self.cadence.saved(self.step, time.perf_counter() - t0, periodic)

    def _ckpt_due(self) -> bool:
        """A periodic checkpoint is due at this step (train.ckpt.cadence); the last step saves its own."""
        return self.step < self.total_steps and self.cadence.due(self.step)

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
                if self.loss_weight is not None:  # an uneven share: the logged loss is the global mean too
                    loss = loss * self.loss_weight
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
        self.guard.finite.update(total if self.scaler else total + self.grad_norm)
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
            startup.mark("checkpoint")
            out.resumed_from = self.step
            log.info("resumed from %s at step %d", resume[0], self.step)
        self._supersede_records()
        self.stragglers.open()
        self.speed.open(sample_gpus=self.dist.is_main)
        progress = Progress(self.total_steps, self.dist.is_main)
        self.model.train()
        start_wall = time.perf_counter()
        last_eval_step = -1
        if self.step < self.total_steps:
            warmup.before_first_step(self._warmup_target())
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
        startup.mark("warmup")  # the first log window starts now
        try:
            return self._train(Loop(out, progress, halt_at, window, start_wall, LogWindow(self.device), last_eval_step))
        finally:
            if window:
                window.close()

    def _train(self, lp: Loop) -> Outcome:
        """The step loop of `_run`, from its first step to the end (or a stop): epochs of steps, and
        after a rollback the same again from the checkpoint's step."""
        lp.win.reset()
        self.cadence.restart(self.step)
        while True:
            try:
                while self.step < self.total_steps:
                    stopped = self._epoch(lp)
                    if stopped:
                        return stopped
                lp.progress.newline()
                self.stops.settle()  # nothing is in flight after the last step; never leave one behind
                self.stragglers.settle()
                if not self.guard.healthy():  # the last log boundary read it; a last check before eval and save
                    raise guard.Diverged(self.step, guard.Reason.NONFINITE, {"where": "at the end"})
                if lp.last_eval_step != self.step:
                    self._eval_and_log(lp.out, lp.progress)
                self._checkpoint(lp.out)
                break
            except guard.Diverged as e:  # every rank, at the same step (an agreed value)
                lp.progress.newline()
                self._rollback(e)
                lp.win.reset()
                self.cadence.restart(self.step)
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
            batches = [self._next_batch(it) for _ in range(self.accum)]
            self.faults.data_wait()  # returns at once, unless a slow data path is injected
            wait = time.perf_counter() - t0
            if not lp.started:
                startup.mark("first_batch")
            seed_step(step_seed(t.seed, self.step, self.dist.rank), self.device)
            lp.win.add(self.train_step(batches), self.grad_norm, wait)
            self.step += 1
            if self.hashes:
                self.hashes.step(self.step)
            if not lp.started:
                self._started(lp, wait)
            if lp.profile:
                lp.profile.after(self.step, wait)
            self.watchdog.beat(self.step)
            self.train_state.eval_pending = self.evaluator.due(self.step, self.steps_per_epoch, self.total_steps)
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

    def _next_batch(self, it):
        """The loader's next micro-batch; its samples, as the loader names them, join the step's hash
        (log.sample_hashes)."""
        batch = next(it)
        if self.hashes:
            self.hashes.add(self.train_loader.last_samples)
        return batch

    def _started(self, lp: Loop, wait: float) -> None:
        """This process's first step is done: the `startup` record (run.startup's phases), which the
        goodput ledger and the restart test read."""
        lp.started = True
        startup.mark("first_step")
        self.metrics.write("startup", **startup.record(self.step - 1), first_batch_wait_s=round(wait, 4))

    def _goodput_record(self, kind: str, last: dict) -> None:
        """Rank 0, at a stop or the end: where this process's time went (run/goodput.py), a `goodput`
        record for the trackers, written just before `last` (the stop or end record, which stays the
        last: readers of metrics.jsonl end a run on it)."""
        if self.metrics.path:
            fields = goodput.attempt_fields(self.metrics.path.parent, {"kind": kind, "time": time.time(), **last})
            if fields:
                self.metrics.write("goodput", step=self.step, **fields)

    def _window(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> tuple[float, float]:
        """The log boundary's one sync (guard.Guard.check: Diverged alike on every rank); the last
        checkpoint is then known good, and kept by pruning."""
        mean, gn = self.guard.check(self.step, loss, grad_norm)
        self.train_state.good_step = self.train_state.last_saved_step
        return mean, gn

    def _warmup_target(self) -> warmup.WarmupTarget:
        """What the start-up warm-ups run on (train.warmup)."""
        return warmup.WarmupTarget(
            self.cfg,
            self.device,
            self.dist.world_size,
            self.model,
            self.fwd_model,
            self.ddp,
            self.optimizer,
            self.step_amp,
            self.control_group,
            self.reduce_hook,
            self.fsdp,
        )

    def _log_window(self, lp: Loop) -> None:
        """A log boundary: the window's one sync (`_window`), its `train` record and progress line,
        then a new window."""
        win, out = lp.win, lp.out
        loss, grad_norm = self._window(*win.means())
        gross = win.elapsed()
        pauses = self.cadence.take_pauses()  # the window's blocking saves and evals, for the goodput ledger
        el = self.cadence.window(win.steps, gross)  # net of the window's saves and evals
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
            self.step,
            el / win.steps,
            win.wait / win.steps,
            (win.wait + self.fwd_clock.take()) / win.steps,
            win.steps,
        )
        # the goodput ledger's split of the window (run/goodput.py): its whole time and steps, rank 0's data
        # wait, blocking saves and evals, and the straggler excess of the last settled round
        rec.update(window_s=round(gross, 4), steps=win.steps, data_wait_s=round(win.wait, 4), **pauses)
        rec.update(self.stragglers.take())
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
        end = dict(
            step=self.step,
            status=out.status,
            wall_s=out.wall_s,
            top1=out.eval.get("top1"),
            top5=out.eval.get("top5"),
            **self.stragglers.take(),  # the last window's round, settled at the end
            **self.cadence.take_pauses(),  # the last eval and save, after the last window
        )
        self._goodput_record("end", end)
        self.metrics.write("end", **end)
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
        stop = dict(
            step=self.step,
            reason=out.status,
            stop_kind=out.stop_kind,
            **self.stragglers.take(),  # the last window's round, settled by the stop
            **self.cadence.take_pauses(),  # the stop's save
        )
        self._goodput_record("stop", stop)
        self.metrics.write("stop", **stop)
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
        self.guard.finite.clear()
        self._supersede_records()
        rollback.report(e, path, skip, self.train_state, self.cfg.health, self.metrics)
        if self.step < self.total_steps:
            self.stops.start(self.step)

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

    def _eval_and_log(self, out: Outcome, progress: Progress) -> None:
        """Evaluate this step (train.evaluator); a best score under ckpt.keep_best saves this step."""
        progress.newline()
        t0 = time.perf_counter()
        out.eval, ema, rec = self.evaluator.run(
            self.step, self.step / self.steps_per_epoch, self.model, self.ema and self.ema.module
        )
        if self.ema:
            out.eval_ema = ema
        self.cadence.pause(time.perf_counter() - t0)  # not training time (StepClock); a best-eval save counts itself
        self.train_state.eval_pending = False
        if self.evaluator.best(out.eval, self.step, self.train_state):
            self._checkpoint(out)  # this step's state, kept by pruning until a better eval
        self.evaluator.log(self.step, rec, out.eval)


def build_trainer(
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
) -> Trainer:
    """A Trainer handed its parts: `model` wrapped, its optimizer, scaler, EMA and mixer
    (train.parts.build_parts), the loaders, and the stop policy (from `stop_flag` unless `stops`).
    `val_loader`: {split: loader} (data.build.build_eval_loaders), or one loader / None."""
    parts = build_parts(cfg, dist, device, model)
    # a StopFlag not installed is never set unless a caller's is
    stops = stops or StopRounds(stop_flag or stopmod.StopFlag(), control_group, cfg.dist.stop_every or 1)
    return Trainer(cfg, dist, device, run_dir, parts, (train_loader, val_loader), stops, control_group, faults)

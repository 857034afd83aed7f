"""W&B: one W&B run per hpctrain run, offline by default in `<run>/wandb/` (compute nodes have no network).

The run id is `trackers.run_key` (from the run directory), passed with `resume="allow"` to every
attempt. wandb ignores `resume` in offline mode (wandb/wandb#4624) and writes each attempt to its own
`offline-run-<time>-<id>/`; `wandb sync --id <id>` uploads several such directories of one run "in
order of start time" (`wandb sync --help`, 0.31), which `hpctrain sync RUN` does. W&B keeps a
history step only if it is not below the run's current step (steps must increase), so a replayed
step would be dropped at upload: the sink never logs it. At start it reads the highest step of the
earlier attempts' offline files (`wandb_file`), and online (`log.wandb_mode=online`) also the
resumed run's `run.step`; then it logs only steps above that, and within an attempt never one
below the last (a rollback's replay). Sources in docs/trackers.md.
"""

from __future__ import annotations

from pathlib import Path

# Heavy optional package (the `trackers` extra; starts a wandb-core service process): this module
# is imported only when log.trackers lists wandb (trackers.open_sink).
import wandb

from hpctrain.config import to_dict
from hpctrain.train.observe.tensorboard import KINDS, scalars
from hpctrain.train.observe.trackers import read_env, run_key, wandb_file


def offline_logs(run_dir: Path, run_id: str) -> list[Path]:
    """This run's offline transaction logs, oldest attempt first."""
    return sorted((Path(run_dir) / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))


def logged_step(run_dir: Path, run_id: str) -> int:
    """The highest history step the earlier attempts wrote (-1: none)."""
    steps = [
        r.history.step.num
        for f in offline_logs(run_dir, run_id)
        for r in wandb_file.records(f)
        if r.WhichOneof("record_type") == "history"
    ]
    return max(steps, default=-1)


class WandbSink:
    def __init__(self, run, floor: int):
        self.run, self.floor, self.step = run, floor, floor

    @classmethod
    def open(cls, cfg, run_dir: Path) -> WandbSink:
        """Start (or continue) the run: config, resolved values and this attempt's env.json as its config."""
        key = run_key(run_dir)
        floor = logged_step(run_dir, key)  # before init adds this attempt's directory
        env = read_env(run_dir)
        config = {
            **to_dict(cfg),
            "resolved": env.get("resolved", {}),
            "env": {k: v for k, v in env.items() if k != "resolved"},
        }
        run = wandb.init(
            project=cfg.log.wandb_project,
            name=cfg.run.name,
            id=key,
            resume="allow",
            mode=cfg.log.wandb_mode,
            dir=str(run_dir),
            config=config,
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True),
        )
        if run.resumed:  # online: the server's run, whose last step may be past our files
            floor = max(floor, run.step - 1)
        return cls(run, floor)

    def restart(self, kept: list[dict], moved: list[dict]) -> None:
        """A resume: log what metrics.jsonl keeps above the floor (none, unless wandb was added to
        log.trackers on this resume); replayed steps come again through `record`."""
        for rec in kept:
            if rec.get("kind") in KINDS:  # a kept stop or end record is history, not this attempt's state
                self.record(rec)

    def record(self, rec: dict) -> None:
        step = rec.get("step")
        values = scalars(rec)
        if values and int(step) > self.floor and int(step) >= self.step:
            self.run.log(values, step=int(step))
            self.step = int(step)
        kind = rec.get("kind")
        if kind == "end":
            self.run.summary.update(
                {k: rec[k] for k in ("status", "step", "wall_s", "top1", "top5") if rec.get(k) is not None}
            )
        elif kind == "stop":
            self.run.summary.update({"status": rec.get("reason")})

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None

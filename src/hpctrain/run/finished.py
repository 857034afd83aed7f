"""A finished run is not trained again: the words for it, and the check `submit` makes before it
launches anything (a Slurm job would otherwise wait in the queue to find nothing to train).

Torch-free: the submitting side reads the run's metrics.jsonl and config.yaml, not its checkpoints.
The job checks again, exactly (train/ckpt/resume_checks.py: check_unfinished), where the loaders tell the
length: both say it in `finished_text`, so this module lives below `launch/` and `train/`.
"""

from __future__ import annotations

from pathlib import Path

from hpctrain.config import Config, ConfigError, read_yaml
from hpctrain.config_moves import current
from hpctrain.run.layout import CHECKPOINTS, CONFIG, METRICS
from hpctrain.run.metrics import read_metrics, total_steps


def finished_text(run_dir: Path, checkpoint: str, step: int, total: int, name: str) -> str:
    return (
        f"run {run_dir} has finished: its checkpoint {checkpoint} is at step {step} of {total}, so there is "
        f"nothing to train (nothing was written). Start another run with --set run.name={name}_2, train this "
        "one again from step 0 with --set run.resume=none, or raise train.epochs (train.max_steps) to train it "
        "further"
    )


def finished_run(cfg: Config) -> str | None:
    """The message when `cfg` would only resume a run that ended `finished` with the same length
    (train.epochs, train.max_steps) and whose last checkpoint is still there; else None."""
    run = cfg.run_dir.expanduser().resolve()
    if cfg.run.resume != "auto":
        return None
    records = read_metrics(run / METRICS)
    ends = [r for r in records if r.get("kind") in ("end", "stop")]
    if not ends or ends[-1].get("kind") != "end" or ends[-1].get("status") != "finished":
        return None
    step = ends[-1].get("step")
    try:
        old_cfg = current(read_yaml(run / CONFIG))  # a run an older release wrote: today's names
    except ConfigError:
        return None
    old, t = old_cfg.get("train") or {}, cfg.train
    if not isinstance(step, int):
        return None
    same = (old.get("epochs"), old.get("max_steps")) == (t.epochs, t.max_steps)
    end = step if same else shorter_end(cfg, old_cfg, records, step)
    if end is None:
        return None
    ckpt = next(
        (
            p.name
            for p in sorted((run / CHECKPOINTS).glob(f"step-{step:08d}*"))
            if p.name in (f"step-{step:08d}", f"step-{step:08d}.pt")
        ),
        None,
    )
    if not ckpt:
        return None
    if same:
        return finished_text(run, ckpt, step, step, cfg.run.name)
    return (
        f"run {run} has finished at step {step} (checkpoint {ckpt}); train.epochs={t.epochs}, train.max_steps="
        f"{t.max_steps} would end it at step {end}, which it has passed: nothing to train (nothing was written). "
        f"Start another run with --set run.name={cfg.run.name}_2, or from step 0 with --set run.resume=none"
    )


def shorter_end(cfg: Config, old: dict, records: list[dict], step: int) -> int | None:
    """The last step the new train.epochs/max_steps give the run (its saved config `old`, its
    `records`), when it is at or before `step` (the run's last); None when it is later or cannot be
    told here (another batch size: the job checks then, exactly)."""
    if (old.get("data") or {}).get("global_batch") != cfg.data.global_batch:
        return None
    new = {"train": {"epochs": cfg.train.epochs, "max_steps": cfg.train.max_steps}}
    end = total_steps(new, records)
    return end if end is not None and end <= step else None

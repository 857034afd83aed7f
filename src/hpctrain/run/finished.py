"""A finished run is not trained again: the words for it, and the check `submit` makes before it
launches anything (a Slurm job would otherwise wait in the queue to find nothing to train).

Torch-free: the submitting side reads the run's metrics.jsonl and config.yaml, not its checkpoints.
The job checks again, exactly (train/ckpt/resume_checks.py: check_unfinished), where the loaders tell the
length: both say it in `finished_text`, so this module lives below `launch/` and `train/`.
"""

from __future__ import annotations

from pathlib import Path

from hpctrain.config import Config, ConfigError, read_yaml
from hpctrain.run.layout import CHECKPOINTS, CONFIG, METRICS
from hpctrain.run.metrics import read_metrics


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
    ends = [r for r in read_metrics(run / METRICS) if r.get("kind") in ("end", "stop")]
    if not ends or ends[-1].get("kind") != "end" or ends[-1].get("status") != "finished":
        return None
    step = ends[-1].get("step")
    try:
        old = read_yaml(run / CONFIG).get("train") or {}
    except ConfigError:
        return None
    t = cfg.train
    if not isinstance(step, int) or (old.get("epochs"), old.get("max_steps")) != (t.epochs, t.max_steps):
        return None
    ckpt = next(
        (
            p.name
            for p in sorted((run / CHECKPOINTS).glob(f"step-{step:08d}*"))
            if p.name in (f"step-{step:08d}", f"step-{step:08d}.pt")
        ),
        None,
    )
    return ckpt and finished_text(run, ckpt, step, step, cfg.run.name)

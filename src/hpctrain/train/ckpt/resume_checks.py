"""What a run checks in a checkpoint before it resumes from it: the same model and global batch
(`check_compatible`), and steps left to train (`check_unfinished`). Both refuse in one line before
anything is overwritten. Torch-free: the checks read the checkpoint's config and step only.
"""

from __future__ import annotations

from pathlib import Path

from hpctrain.config import Config, ModelConfig, to_dict
from hpctrain.config_moves import current
from hpctrain.errors import UserError
from hpctrain.run.finished import finished_text


class ResumeError(UserError, RuntimeError):
    """A checkpoint that does not fit this run's config; nothing has been overwritten."""


class RunFinished(UserError, RuntimeError):
    """The run's checkpoint is at its last step: nothing to train, and nothing is written."""


def planned_steps(cfg: Config, batches_per_epoch: int) -> int:
    """The run's length in optimizer steps: train.max_steps, else train.epochs of the loader's batches."""
    return cfg.train.max_steps or cfg.train.epochs * (batches_per_epoch // cfg.train.accum_steps)


def check_unfinished(cfg: Config, st: dict, path: Path, run_dir: Path, batches_per_epoch: int) -> None:
    """Refuse to resume a run that has already trained all its steps. Resuming it would train
    nothing, evaluate again and save its last step a second time (in this launch's checkpoint
    format, beside the first); the summary would read "loss nan, 0 images/s"."""
    if not cfg.train.max_steps and batches_per_epoch < cfg.train.accum_steps:
        return  # no step in an epoch: the Trainer says so
    total, step = planned_steps(cfg, batches_per_epoch), int(st["step"])
    if step < total:
        return
    raise RunFinished(finished_text(run_dir, path.name, step, total, cfg.run.name))


def check_compatible(cfg: Config, st: dict, path: Path) -> None:
    """Refuse a checkpoint of another model or global batch, before anything is overwritten."""
    old = current(st.get("config") or {})  # a checkpoint an older release wrote: its keys in today's names
    problems = []
    now = {k: v for k, v in to_dict(cfg.model).items() if k not in cfg.model.START_KEYS}  # not the model
    # a key newer than the checkpoint (model.drop_rate...) counts as its default there: the model it built
    default = to_dict(ModelConfig())
    diff = [k for k, v in now.items() if old.get("model") and old["model"].get(k, default[k]) != v]
    if diff:
        problems.append(f"the model differs in {', '.join('model.' + k for k in diff)}")
    if st.get("global_batch") not in (None, cfg.data.global_batch):
        problems.append(
            f"the global batch was {st['global_batch']}, now {cfg.data.global_batch} (a new world "
            f"size, {st.get('world_size')} before, is fine when the global batch stays the same)"
        )
    if problems:
        raise ResumeError(
            f"cannot resume from {path}: {'; '.join(problems)}. Resume with the original "
            "settings (see the run's config.yaml), or start a new run (another run.name, or "
            "--resume none)"
        )

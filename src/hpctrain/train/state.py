"""The counters a run carries from step to step and across checkpoints, in one place, and how a run
ended (`Outcome`).

Kept apart from the Trainer so that what a checkpoint restores is one object (torchtitan's
`TrainState`): the checkpointer reads and sets it, the rollback moves it back, the loop counts on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainState:
    """Where the run is. `step`, `data_offset`, `eval_pending`, `best` and `rollbacks` are saved in
    every checkpoint (under those keys, as before this class); the last good and last saved steps
    are this attempt's bookkeeping and follow from the step a checkpoint is loaded at."""

    step: int = 0
    data_offset: int = 0  # optimizer steps' worth of batches skipped by rollbacks (the loader runs ahead)
    eval_pending: bool = False  # this step ended an epoch whose eval has not run yet
    best: tuple[float, int] | None = None  # (top-1, step) of the best eval whose checkpoint is kept
    rollbacks: int = 0  # in this run (kept in checkpoints, not reset by a rollback)
    good_step: int = -1  # newest checkpoint known good: a clean check came after it; never pruned
    last_saved_step: int = -1

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's fields of this state, under the checkpoint's keys."""
        return {
            "step": self.step,
            "eval_pending": self.eval_pending,
            "data_offset": self.data_offset,
            "rollbacks": self.rollbacks,
            "best": list(self.best) if self.best else None,
        }

    def load_state_dict(self, st: dict[str, Any]) -> None:
        """From a checkpoint (older ones lack the later keys); its step is on disk and known good."""
        self.step = int(st["step"])
        self.last_saved_step = self.step  # on disk already: never saved again (nor in another format)
        self.good_step = self.step  # it trained on, or it was resumed from: known good
        self.data_offset = int(st.get("data_offset", 0))  # absent before rollbacks existed
        self.rollbacks = int(st.get("rollbacks", 0))
        self.best = tuple(st["best"]) if st.get("best") else None
        self.eval_pending = bool(st.get("eval_pending", False))  # absent in older checkpoints

    def loader_position(self, steps_per_epoch: int) -> tuple[int, int]:
        """(epoch, step within it) of the train loader: rollbacks moved it `data_offset` steps on."""
        return divmod(self.step + self.data_offset, steps_per_epoch)


@dataclass
class Outcome:
    """How a `Trainer.run` ended (or where it is): what the task reports and the summary holds."""

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

"""The training loop's evals: which epochs evaluate, every split of `data.eval_splits` (and the
EMA weights'), their `eval` record, the log lines and the best score that `ckpt.keep_best` keeps.

Each split is one exact pass over every rank (train.eval_pass.evaluate, shared with `hpctrain
eval`), so the numbers are the same on every rank and every rank takes the same decisions from them.
"""

from __future__ import annotations

import logging

import torch

from hpctrain.config import Config
from hpctrain.data.loader import Loader
from hpctrain.run.metrics import MetricsWriter
from hpctrain.train.eval_pass import evaluate
from hpctrain.train.state import TrainState

log = logging.getLogger("hpctrain")


class Evaluator:
    """`loaders`: {split: loader} (data.build.build_eval_loaders), or one loader / None for the
    headline split alone (the first of data.eval_splits)."""

    def __init__(
        self,
        cfg: Config,
        device: torch.device,
        loaders: Loader | dict[str, Loader] | None,
        metrics: MetricsWriter,
        is_main: bool,
    ):
        self.cfg, self.device, self.metrics, self.is_main = cfg, device, metrics, is_main
        self.loaders = (
            dict(loaders)
            if isinstance(loaders, dict)
            else ({} if loaders is None else {cfg.data.eval_splits[0]: loaders})
        )

    def due(self, step: int, steps_per_epoch: int, total_steps: int) -> bool:
        """`step` ends an epoch that `train.eval_every_epochs` evaluates (the last step has its own)."""
        ep, pos = divmod(step, steps_per_epoch)
        every = self.cfg.train.eval_every_epochs
        return pos == 0 and every > 0 and ep % every == 0 and step < total_steps

    def record(self, model: torch.nn.Module, prefix: str = "") -> tuple[dict, dict]:
        """(the headline split's results, the record fields): with one split its results under their
        names (`top1`...), as ever; with several, also every split's under `<split>/<prefix><name>`
        (TensorBoard `eval/<split>/top1`), each split evaluated once."""
        results = {
            split: evaluate(model, loader, self.cfg.train.amp, self.device) for split, loader in self.loaders.items()
        }
        head = next(iter(results.values()), {})
        fields = {f"{prefix}{k}": v for k, v in head.items()}
        if len(self.cfg.data.eval_splits) > 1:
            for split, res in results.items():
                fields.update({f"{split}/{prefix}{k}": v for k, v in res.items()})
        return head, fields

    def run(
        self, step: int, epoch: float, model: torch.nn.Module, ema: torch.nn.Module | None
    ) -> tuple[dict, dict, dict]:
        """Evaluate `model` (and the EMA weights) on every split and write the `eval` record:
        (the headline results, the EMA's or {}, the record)."""
        head, fields = self.record(model)
        rec = {"step": step, "epoch": epoch, **fields}
        head_ema: dict = {}
        if ema is not None:
            head_ema, fields = self.record(ema, "ema_")
            rec.update(fields)
        self.metrics.write("eval", **rec)
        return head, head_ema, rec

    def best(self, head: dict, step: int, state: TrainState) -> bool:
        """ckpt.keep_best: `head` is the best top-1 so far (then `state.best` is this step's, and its
        checkpoint is kept by pruning until a better eval). The same on every rank: the eval is
        summed over all of them."""
        top1 = head.get("top1")
        if not self.cfg.ckpt.keep_best or top1 is None or (state.best is not None and top1 <= state.best[0]):
            return False
        state.best = (top1, step)
        return True

    def log(self, step: int, rec: dict, head: dict) -> None:
        """Rank 0's log line per split (or one for the headline split)."""
        if not self.is_main:
            return
        if len(self.loaders) > 1:
            for split in self.loaders:
                log.info(
                    "eval step %d on %s: top-1 %.2f%% top-5 %.2f%% (%d images)",
                    step,
                    split,
                    rec[f"{split}/top1"],
                    rec[f"{split}/top5"],
                    rec[f"{split}/count"],
                )
        elif head:
            log.info(
                "eval step %d: top-1 %.2f%% top-5 %.2f%% (%d images)", step, head["top1"], head["top5"], head["count"]
            )

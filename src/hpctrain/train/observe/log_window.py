"""The sums the loop keeps between log boundaries (`log.every` steps), and over the run.

The loss and gradient norm stay on the device, so a step reads nothing back to the host; the one
sync is at the log boundary (train.health.guard.Guard.check, from `Trainer._window`), which then starts a
new window.
"""

from __future__ import annotations

import time

import torch


class LogWindow:
    """Loss, gradient norm, data wait and steps of the current window; data wait and steps of the run."""

    def __init__(self, device: torch.device) -> None:
        self.loss = torch.zeros((), device=device)
        self.grad_norm = torch.zeros((), device=device)
        self.total_wait, self.total_steps = 0.0, 0
        self.reset()

    def reset(self) -> None:
        """A new window, from now: after a log boundary, and after a rollback (whose steps are gone)."""
        self.loss.zero_()
        self.grad_norm.zero_()
        self.t0, self.wait, self.steps = time.perf_counter(), 0.0, 0

    def add(self, loss: torch.Tensor, grad_norm: torch.Tensor, wait: float) -> None:
        """One optimizer step: its loss and gradient norm (device scalars) and its data wait (s)."""
        self.loss += loss
        self.grad_norm += grad_norm
        self.wait += wait
        self.total_wait += wait
        self.steps += 1
        self.total_steps += 1

    def means(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean loss, mean gradient norm) of the window's steps, still on the device."""
        return self.loss / self.steps, self.grad_norm / self.steps

    def elapsed(self) -> float:
        """Seconds since the window started."""
        return time.perf_counter() - self.t0

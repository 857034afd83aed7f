"""The one base of every error meant for the person running hpctrain (not a bug in it), and the step
an error stopped training at."""

from __future__ import annotations

import contextlib


class UserError(Exception):
    """A problem the user can fix; its message names it and the fix. The CLI prints it as one line."""

    # A fault outside the user's hands that a restart of the step may clear (a rank that died under
    # a collective): the batch shell restarts it. Otherwise a restart would fail the same way.
    transient: bool = False


class LaunchError(UserError, RuntimeError):
    """A job that cannot be planned, submitted or continued, with the fix in the message."""


STEP_ATTR = "hpctrain_step"


def mark_step(e: BaseException, step: int) -> None:
    """Tag an exception that left the training loop with the step it stopped in (1 for the first). The task's crash
    line (launch.failure) names it, so that the batch shell tells a bug (the same error at the same
    step after a restart) from a fault (launch/shell/restarts.sh)."""
    if getattr(e, STEP_ATTR, None) is None:  # the innermost loop that saw it knows best
        with contextlib.suppress(AttributeError):  # an exception type without a __dict__
            setattr(e, STEP_ATTR, int(step))


def step_of(e: BaseException) -> int | None:
    """The step `mark_step` tagged `e` with, if any."""
    step = getattr(e, STEP_ATTR, None)
    return step if isinstance(step, int) else None

"""Stop requests: the signals that ask a run to checkpoint at the next step boundary and exit.

Slurm asks in two ways (DESIGN.md, "What real sites do"): `--signal=USR2@T` before the time
limit, and SIGTERM (after SIGCONT) when the job is preempted, followed by SIGKILL once the
partition's GraceTime has passed. Both mean "checkpoint at the next step, then exit"; they are
told apart only to count requeues (`slurm.max_requeues` vs `slurm.max_preemptions`).

Every rank must stop at the same step, so the ranks agree on it: the OR of their stop bits is
an all-reduce on the gloo control group, started (non-blocking) at one step boundary and read at
the next (`Trainer._stop_check`), so it never holds a step up. The price is latency: a signal
that arrives while step n runs is posted at the end of step n and acted on at the end of step
n+1, where every rank checkpoints and exits: at most two step boundaries after the signal (one
more step than a blocking check). `train.halt_at` needs no agreement and stops exactly there.
Budget the warning time (`--signal=USR2@T`, a partition's GraceTime) for two steps plus a
checkpoint (docs/communication.md).

The handler only records the signal: logging from inside a handler can re-enter the logging
machinery, so the record is logged by the loop at the next check. Nothing here imports torch:
task entry points install the handlers before any heavy import, rendezvous or model build.
"""

from __future__ import annotations

import logging
import signal
import time

log = logging.getLogger("hpctrain")

# signal → what it means for the requeue budget
KINDS = {signal.SIGUSR2: "time_limit", signal.SIGTERM: "preemption"}
# bits for the all-reduce that makes the stop decision unanimous (see train.loop)
BITS = {"time_limit": 1, "preemption": 2, "halt": 4}


class StopFlag:
    """Records stop signals; `flag()` is True once any arrived. One instance per process: `STOP`."""

    def __init__(self) -> None:
        self.received: list[tuple[int, float]] = []
        self._logged = 0
        self.installed = False

    def __call__(self) -> bool:
        self.log_new()
        return bool(self.received)

    @property
    def kind(self) -> str | None:
        """'preemption' when a SIGTERM arrived (it wins), 'time_limit' for USR2 only, else None."""
        kinds = {KINDS.get(s, "time_limit") for s, _ in self.received}
        return "preemption" if "preemption" in kinds else (kinds.pop() if kinds else None)

    def bits(self) -> int:
        k = self.kind
        return BITS[k] if k else 0

    def handler(self, signum: int, frame) -> None:
        self.received.append((signum, time.time()))

    def install(self) -> StopFlag:
        """Take over USR2 and TERM (replacing submitit's or Python's default handlers)."""
        for s in KINDS:
            signal.signal(s, self.handler)
        self.installed = True
        return self

    def log_new(self) -> None:
        """One log line per signal received since the last call (at the next step boundary)."""
        for signum, t in self.received[self._logged:]:
            log.warning("received %s at %s (%s): checkpointing at the next step boundary, then exiting",
                        signal.Signals(signum).name, time.strftime("%H:%M:%S", time.localtime(t)),
                        KINDS.get(signum, "stop"))
        self._logged = len(self.received)


STOP = StopFlag()


def install() -> StopFlag:
    """Install the process-wide handlers once; returns the flag every part of the run reads."""
    if not STOP.installed:
        STOP.install()
    return STOP


def kind_of(bits: int) -> str:
    """The agreed reason of a stop from the OR of every rank's bits (preemption wins)."""
    for k in ("preemption", "time_limit", "halt"):
        if bits & BITS[k]:
            return k
    return "halt"

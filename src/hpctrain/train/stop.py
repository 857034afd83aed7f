"""Stop requests: the signals that ask a run to checkpoint at the next step boundary and exit.

Slurm asks in two ways (docs/launch.md "Slurm", the signal table): `--signal=USR2@T` before the time
limit, and SIGTERM (after SIGCONT) when the job is preempted, followed by SIGKILL once the
partition's GraceTime has passed. Both mean "checkpoint at the next step, then exit"; they are
told apart only to count requeues (`slurm.max_requeues` vs `slurm.max_preemptions`).

Every rank must stop at the same step, so the ranks agree on it: the OR of their stop bits is
an all-reduce on the gloo control group, started (non-blocking) at one agreement boundary and read
at the next, K = dist.stop_every steps later (`StopRounds.at_boundary`), so it never holds a step
up. The price is latency: a signal that arrives just after a round was posted goes with the next
one and is acted on when that is read, where every rank checkpoints and exits: at most 2K step
boundaries after the signal (two with K = 1). A halt (HPCTRAIN_HALT_AT, `halt_at`) needs no
agreement and stops exactly there. Budget the warning time (`--signal=USR2@T`, a partition's
GraceTime) for 2K steps plus a checkpoint (docs/communication.md, "Every K steps").

A Ctrl-C (SIGINT) is a third kind, `interrupt`, where a command takes it (`hpctrain train`, the
tasks of a job; launch.localjob for a local `hpctrain submit`): the same stop at the next step
with its checkpoint and stop record, never requeued, and the command exits 130. A second Ctrl-C
raises KeyboardInterrupt at once (no checkpoint). Library callers of `install()` keep Python's
own SIGINT behaviour.

The handler only records the signal: logging from inside a handler can re-enter the logging
machinery, so the record is logged by the loop at the next check. Nothing here imports torch:
task entry points install the handlers before any heavy import, rendezvous or model build.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Mapping

log = logging.getLogger("hpctrain")

# signal → what it means for the requeue budget
KINDS = {signal.SIGUSR2: "time_limit", signal.SIGTERM: "preemption", signal.SIGINT: "interrupt"}
# bits for the all-reduce that makes the stop decision unanimous (see train.loop)
# `exclude`: a node holds the job up (health.exclude_straggler_frac); every rank knows it at the same
# step, so it is never posted, like `halt`
BITS = {"time_limit": 1, "preemption": 2, "halt": 4, "interrupt": 8, "exclude": 16}
# the agreed kind when several arrived: the user's Ctrl-C wins (no requeue), then a preemption
PRIORITY = ("interrupt", "preemption", "time_limit", "exclude", "halt")


HALT_AT_ENV = "HPCTRAIN_HALT_AT"  # tests: checkpoint and stop at this step as if preempted


def halt_at(env: Mapping[str, str]) -> int:
    """The step HPCTRAIN_HALT_AT names (0: none). A test knob, not a setting: a run halted there
    resumes as one preempted at that step would, which is what the resume tests compare."""
    text = env.get(HALT_AT_ENV, "").strip()
    if not text:
        return 0
    if not text.isdigit():
        raise ValueError(f"{HALT_AT_ENV}={text!r}: give a step number (0: off)")
    return int(text)


END_FILE_ENV = "HPCTRAIN_END_FILE"  # the batch shell's clock (launch/shell/clock.sh): `<end> [stop]`
END_FILE_POLL_S = 2.0  # at most one stat of it every 2 s, whatever the step time, by rank 0 only (train.entry)


class EndFile:
    """The job's current end, as the batch shell's clock keeps it: re-read from slurmctld there (the
    tasks have no Slurm client), so a TimeLimit extension or a suspend moves it, and `stop` once the
    time limit's stop is due (the shell decides, having asked Slurm for the end just before). Read
    again only when the file changed (its inode and mtime: one stat, at most every END_FILE_POLL_S)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.end: int | None = None
        self.due = False
        self._seen: tuple[int, int] | None = None
        self._next = 0.0

    def poll(self) -> bool:
        """True once the shell says the stop is due; logs each move of the end."""
        now = time.monotonic()
        if now < self._next:
            return self.due
        self._next = now + END_FILE_POLL_S
        try:
            st = os.stat(self.path)
            if (st.st_ino, st.st_mtime_ns) == self._seen:
                return self.due
            self._seen = (st.st_ino, st.st_mtime_ns)
            with open(self.path) as f:
                words = f.readline().split()
        except OSError:
            return self.due
        if not words or not words[0].isdigit():
            return self.due
        end = int(words[0])
        if self.end is not None and end != self.end:
            log.info(
                "the job's end moved from %s to %s (a TimeLimit change or a suspend): the time-limit stop moves too",
                time.strftime("%H:%M:%S", time.localtime(self.end)),
                time.strftime("%H:%M:%S", time.localtime(end)),
            )
        self.end, self.due = end, "stop" in words[1:]
        return self.due


def deadline_from(env: Mapping[str, str]) -> float | None:
    """When the time-limit stop is due by the job's own clock: SLURM_JOB_END_TIME (Slurm >= 23.02, a
    Unix time) minus the batch script's signal lead (HPCTRAIN_SIGNAL_LEAD_S); None outside such a job."""
    end, lead = env.get("SLURM_JOB_END_TIME", ""), env.get("HPCTRAIN_SIGNAL_LEAD_S", "")
    if not (end.isdigit() and lead.isdigit()) or int(end) <= 0:
        return None
    return float(int(end) - int(lead))


class StopFlag:
    """Records stop signals; `flag()` is True once any arrived. One instance per process: `STOP`.

    A second clock for the time limit: the USR2 Slurm sends before it can be lost (sent while the
    batch shell started a new step, or forwarded before a slow container's tasks were up: Slurm drops
    it then). Under the hpctrain batch script it is the shell's clock (`end_file`, HPCTRAIN_END_FILE),
    which follows the job's EndTime as Slurm moves it; elsewhere, `deadline` (deadline_from), fixed at
    the start. Once it is due and no stop signal came, the flag raises a time-limit stop itself."""

    def __init__(self) -> None:
        self.received: list[tuple[int, float]] = []
        self._logged = 0
        self.installed = False
        self.deadline: float | None = None
        self.end_file: EndFile | None = None

    def check_clock(self) -> None:
        """Raise the time-limit stop once the job's own clock says it is due (outside a handler)."""
        if self.received:
            return
        now = time.time()
        if self.end_file is not None:
            if not self.end_file.poll():
                return
            why = "the batch shell's clock says so (the job's EndTime, re-read from Slurm, less HPCTRAIN_SIGNAL_LEAD_S)"
        elif self.deadline is not None and now >= self.deadline:
            why = "by SLURM_JOB_END_TIME less HPCTRAIN_SIGNAL_LEAD_S"
        else:
            return
        log.warning(
            "the job's time limit is %s s away or less, %s, and no stop signal came: checkpointing at the next "
            "step boundary as for a time limit, then exiting",
            os.environ.get("HPCTRAIN_SIGNAL_LEAD_S", "?"),
            why,
        )
        self.received.append((signal.SIGUSR2, now))
        self._logged = len(self.received)

    def __call__(self) -> bool:
        self.log_new()
        return bool(self.received)

    @property
    def kind(self) -> str | None:
        """The kind of the signals received, by PRIORITY ('interrupt', 'preemption', 'time_limit'); None."""
        kinds = {KINDS.get(s, "time_limit") for s, _ in self.received}
        return next((k for k in PRIORITY if k in kinds), None)

    def bits(self) -> int:
        self.check_clock()
        k = self.kind
        return BITS[k] if k else 0

    def handler(self, signum: int, frame) -> None:
        if signum == signal.SIGINT and any(s == signal.SIGINT for s, _ in self.received):
            raise KeyboardInterrupt  # the second Ctrl-C: out now
        self.received.append((signum, time.time()))

    def install(self, interrupt: bool = False) -> StopFlag:
        """Take over USR2 and TERM (replacing submitit's or Python's default handlers), and SIGINT
        with `interrupt`."""
        for s, kind in KINDS.items():
            if kind != "interrupt" or interrupt:
                signal.signal(s, self.handler)
        self.installed = True
        self.deadline = deadline_from(os.environ)
        end_file = os.environ.get(END_FILE_ENV, "")
        self.end_file = EndFile(end_file) if end_file else None
        return self

    def log_new(self) -> None:
        """One log line per signal received since the last call (at the next step boundary)."""
        for signum, t in self.received[self._logged :]:
            log.warning(
                "received %s at %s (%s): checkpointing at the next step boundary, then exiting",
                signal.Signals(signum).name,
                time.strftime("%H:%M:%S", time.localtime(t)),
                KINDS.get(signum, "stop"),
            )
        self._logged = len(self.received)


STOP = StopFlag()


def install(interrupt: bool = False) -> StopFlag:
    """Install the process-wide handlers once (SIGINT too with `interrupt`: a command's Ctrl-C);
    returns the flag every part of the run reads."""
    if not STOP.installed:
        STOP.install(interrupt)
    elif interrupt:
        signal.signal(signal.SIGINT, STOP.handler)
    return STOP


def kind_of(bits: int) -> str:
    """The agreed reason of a stop from the OR of every rank's bits (by PRIORITY)."""
    for k in PRIORITY:
        if bits & BITS[k]:
            return k
    return "halt"

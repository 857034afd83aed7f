"""The batch shell's wait for a step (launch/shell/step_wait.sh, signals.sh's hpctrain_wait): through
trapped signals to srun's own exit status, and never spinning on a PID that srun no longer holds."""

from __future__ import annotations

import subprocess
import textwrap

from hpctrain import shellfile

WAIT = "\n".join(shellfile.lines("step_wait.sh"))
PRELUDE = "\n".join(shellfile.lines("signals.sh")) + textwrap.dedent("""
    HPCTRAIN_STOP_FILE=/nonexistent/stop hpctrain_signal=""
    hpctrain_preempted() { return 1; }
    trap 'hpctrain_signal=USR2' USR2
""")


def run(script: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=timeout)


def test_signals_during_the_step_leave_sruns_exit_status():
    """Each trapped USR2 ends `wait` early (status 138); the loop waits on until the step itself ends."""
    r = run(
        PRELUDE
        + "(sleep 1.5; exit 7) &\n"  # the step: srun's stand-in
        + "( sleep 0.3; kill -USR2 $$; sleep 0.3; kill -USR2 $$ ) &\n"
        + WAIT.replace("hpctrain_srun=$!", "hpctrain_srun=$(jobs -p %1)")
        + "\nhpctrain_step_wait"
        + '\necho "rc=$hpctrain_rc signal=$hpctrain_signal"'
    )
    assert r.stdout.split() == ["rc=7", "signal=USR2"], r.stdout + r.stderr


def test_a_pid_that_srun_no_longer_holds_ends_the_wait():
    """After srun ends its PID may go to another process (not this shell's child): `wait` answers at
    once and kill -0 finds it alive, so the old loop spun until the job's time limit. Reproduced with a
    live orphan (parent: init) in srun's place."""
    r = run(
        PRELUDE
        + "other=$( (sleep 60 >/dev/null 2>&1 & echo $!) )\n"  # alive, not this shell's child
        + "(exit 3) & sleep 0.2\n"  # srun ended (status 3) and was reaped ...
        + "wait $!; hpctrain_rc=3\n"
        + WAIT.replace("hpctrain_srun=$!", 'hpctrain_srun=$other; kill -0 "$hpctrain_srun"')  # ... and its PID reused
        + "\nhpctrain_step_wait"
        + '\necho "rc=$hpctrain_rc"; kill "$other"',
        timeout=30,
    )
    assert r.returncode == 0 and "rc=127" in r.stdout, r.stdout + r.stderr

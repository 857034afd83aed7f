"""The batch shell takes its USR2/TERM at once (launch/shell/signals.sh): bash defers a trap until the
foreground command ends, so a long command (an image copy, a probe step, slurmctld retries) runs in
the background and is waited for. The parts run under bash as rendered, with stand-ins for srun and
scontrol that block on a fifo: the trap's line must appear while the stand-in still blocks (an event,
not a timing). Also: a stop that came before a step requeues the job without starting it, a PID that
is no longer the step's is never signalled, and the background helpers (heartbeat, warm-up step) end
with the shell."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from hpctrain import shellfile
from hpctrain.launch import inplace
from hpctrain.launch.sbatch import main_lines, step_lines, stop_lines

TRAP_LINE = "batch shell received SIGUSR2"
DEADLINE_S = 60  # a bound on waiting for an event, never a measured time


def stand_ins(tmp_path: Path, block: str = "", nodes: str = "n1") -> dict[str, str]:
    """srun and scontrol on PATH, answering at once as for a job RUNNING on `nodes`; `block` ("srun" or
    "scontrol show job") notes that it started, then blocks on a fifo until the test writes it (then fails)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.mkfifo(tmp_path / "fifo")
    blocking = f'echo "$0 $*" >> {tmp_path}/started; read -r _ < {tmp_path}/fifo; exit 1'
    job = f"echo JobId=1 JobName=j JobState=RUNNING Restarts=0 NodeList={nodes} StdErr="
    bodies = {
        "scontrol": (
            'case "$1 $2" in\n'
            '  "show hostnames") printf "%s\\n" "$3" | tr , "\\n" ;;\n'
            f'  "show job") {blocking if block == "scontrol show job" else job} ;;\n'
            f'  "requeue "*) echo "$*" >> {tmp_path}/requeued ;;\n'
            "esac\n"
        ),
        "srun": (blocking if block == "srun" else 'echo "$$" >> "$HPCTRAIN_TEST_PIDS"; exec sleep 300') + "\n",
    }
    for name, body in bodies.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NUM_NODES": str(len(nodes.split(","))),
        "SLURM_JOB_NODELIST": nodes,
        "HPCTRAIN_TEST_PIDS": str(tmp_path / "pids"),
    }


def start(script: str, tmp_path: Path, env: dict[str, str]) -> subprocess.Popen:
    """The script under bash in its own session (so that the test can end all it started)."""
    err = open(tmp_path / "stderr", "w")  # noqa: SIM115 (closed with the process, below)
    p = subprocess.Popen(
        ["bash", "-c", script], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
    )
    err.close()
    return p


def wait_for(what, deadline_s: float = DEADLINE_S) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if what():
            return True
        time.sleep(0.05)
    return False


def session_left(sid: int) -> list[str]:
    """Processes still in the session `sid` (the test's bash and all it started)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            s = stat.read_text()
        except OSError:
            continue
        fields = s[s.rindex(")") + 2 :].split()  # STATE PPID PGRP SESSION ...
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(s[: s.rindex(")") + 1])
    return out


def end_session(p: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)  # the group this test started (start_new_session)
    p.wait(timeout=30)


def with_setup(lines: list[str]) -> str:
    """Shell parts as the script inlines them, then their setup (the script's main runs it)."""
    return "\n".join([*lines, *shellfile.setup_calls(lines)])


PARTS = with_setup(stop_lines())
SPARES = with_setup(inplace.setup_lines(0, 1, 0))
NAME_FAULTS = SPARES + "\nhpctrain_rc=1 hpctrain_step_hosts=' n1 '\nhpctrain_name_faults"
CASES = {
    # the image copy, one srun step before training (stage_step.sh)
    "image copy": (
        "srun",
        "CONTAINER=apptainer hpctrain_spares=0 hpctrain_alloc=' n1 ' hpctrain_train_nodes=1\n"
        + "\n".join(shellfile.lines("stage_step.sh")),
    ),
    # after a failed step, the probe step over the nodes (spares.sh: hpctrain_name_faults)
    "probe step": ("srun", NAME_FAULTS),
    # slurmctld does not answer (ctld.sh asks again for up to HPCTRAIN_CTLD_WAIT_S) when the shell asks
    # whether the job still runs, before it names faulty nodes
    "slurmctld stall": ("scontrol show job", NAME_FAULTS),
}


@pytest.mark.parametrize("case", CASES)
def test_a_usr2_during_a_long_command_runs_the_trap_while_the_command_still_runs(tmp_path, case):
    """Before, bash ran the trap only once the command ended: a USR2 during a several-minute image copy,
    a probe step waiting for a node, or retries through a slurmctld restart came too late to checkpoint."""
    block, part = CASES[case]
    env = stand_ins(tmp_path, block)
    p = start(f"{PARTS}\n{part}\n", tmp_path, env)
    try:
        assert wait_for(lambda: (tmp_path / "started").exists()), (tmp_path / "stderr").read_text()
        os.kill(p.pid, signal.SIGUSR2)
        trapped = wait_for(lambda: TRAP_LINE in (tmp_path / "stderr").read_text())
        still_blocked = p.poll() is None
        assert trapped and still_blocked, (tmp_path / "stderr").read_text()
        with open(tmp_path / "fifo", "w") as f:  # the command ends: the shell goes on past it
            f.write("go\n")
        p.wait(timeout=DEADLINE_S)
    finally:
        end_session(p)


def test_a_stop_signal_that_came_before_the_step_requeues_the_job_without_starting_it(tmp_path):
    """A USR2 during the image copy: the trap acts at once, but no step runs yet to pass it to. Before,
    the training step started after it and never heard of the stop: on Slurm 22.05 (no SLURM_JOB_END_TIME
    for the tasks' own clock) the job ran into its time limit and ended TIMEOUT, never requeued. Now no
    step starts and the shell requeues the job (scontrol requeue) to resume from the last checkpoint."""
    env = stand_ins(tmp_path)
    script = "\n".join(
        [
            PARTS,
            SPARES,
            with_setup(inplace.guard_lines()),
            "kill -USR2 $$  # as during the image copy (the trap ran; the copy went on and ended)",
            *step_lines(),
            *main_lines([], "true"),  # the parts' setup ran above
        ]
    )
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "pids").exists(), "a training step started after the stop signal"
    assert (tmp_path / "requeued").read_text() == "requeue 7\n", r.stdout + r.stderr
    assert "a stop signal (SIGUSR2) came before the step started: requeued" in r.stdout, r.stdout


ORPHAN = (  # notes each USR2 it gets, and ends at a TERM; traps run in signal order, USR2 (12) before TERM (15)
    "trap 'echo usr2 >> other-log' USR2; trap 'echo term >> other-log; exit 0' TERM; : > other-ready;"
    " while :; do sleep 1 & wait $!; done"
)


def test_a_usr2_reaches_the_running_step_but_never_a_pid_that_is_no_longer_ours(tmp_path):
    """`kill -USR2 "$hpctrain_srun"` (stops.sh) runs only while that PID is still this shell's child:
    once srun has ended, its PID may belong to another user's process or one of the job's own. A live
    orphan (parent: init) stands for such a process; a child that traps USR2 for the running step."""
    script = (
        PARTS
        + f"\nother=$( (exec bash -c {shlex.quote(ORPHAN)} >/dev/null 2>&1) & echo $!)\n"  # not this shell's child
        + "until [ -e other-ready ]; do sleep 0.05; done\n"
        + "hpctrain_srun=$other; kill -USR2 $$\n"
        + 'kill -TERM "$other"; until grep -q term other-log 2>/dev/null; do sleep 0.05; done\n'
        + "(trap 'echo step-got-usr2 > step; kill $!; exit 0' USR2; sleep 300 >/dev/null 2>&1 & : > ready; wait) &\n"
        + "hpctrain_srun=$!; until [ -e ready ]; do sleep 0.05; done; kill -USR2 $$; wait $hpctrain_srun\n"
    )
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=DEADLINE_S)
    assert (tmp_path / "other-log").read_text() == "term\n", r.stderr  # no usr2 line: it was left alone
    assert r.stderr.count(TRAP_LINE) == 2, r.stderr
    assert (tmp_path / "step").read_text() == "step-got-usr2\n"


def test_the_heartbeat_and_the_warm_up_step_end_with_the_batch_shell(tmp_path):
    """With spares the shell starts a heartbeat loop and a warm-up srun on the spares (guard.sh) in the
    background; before, both outlived the shell (the heartbeat's loop kept writing into the run's
    .hpctrain/). Nothing of the shell's session is left once it has exited."""
    env = {
        **stand_ins(tmp_path, nodes="n1,n2"),
        "SLURMD_NODENAME": "n1",
        "HPCTRAIN_GUARD_S": "300",
    }
    script = "\n".join([PARTS, with_setup(inplace.setup_lines(1, 1, 0)), with_setup(inplace.guard_lines())])
    # once both steps and the heartbeat are up: exit
    up = 'until [ -s .hpctrain/alive-7 ] && [ "$(wc -l < "$HPCTRAIN_TEST_PIDS")" = 2 ]; do sleep 0.05; done 2>/dev/null'
    p = start(f"{script}\n{up}\nexit 0\n", tmp_path, env)
    try:
        p.wait(timeout=DEADLINE_S)
        stderr = (tmp_path / "stderr").read_text()
        assert len((tmp_path / "pids").read_text().split()) == 2, stderr  # the guard's step and the warm-up step
        assert (tmp_path / ".hpctrain" / "alive-7").exists(), stderr  # the heartbeat ran
        assert wait_for(lambda: not session_left(p.pid)), session_left(p.pid)
    finally:
        end_session(p)

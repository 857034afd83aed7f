"""In-job restarts after a failed step that named no faulty node (launch/shell/restarts.sh, the
crash lines of launch.failure): which failures run again on the same nodes, and which end the job.

The decision is bash; here it runs in bash with the batch script's own functions (spares.sh,
restarts.sh) and a crash file written by `failure.write_crash_line`, outside Slurm (the step loop
around it runs on the Slurm test cluster: tests/faults/test_rank_crash.py)."""

from __future__ import annotations

import subprocess

from hpctrain import shellfile
from hpctrain.errors import UserError, mark_step, step_of
from hpctrain.launch import failure
from hpctrain.launch.inplace import NODE_ERE


def decide(tmp_path, rounds: list[list[tuple]], max_restarts: int = 3) -> list[tuple[int, str]]:
    """The shell's decision after each of `rounds` failed steps in one allocation (a round: the
    crash lines its ranks wrote, as (rank, step, error)); per round, (exit of hpctrain_restart_here,
    what it said)."""
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", "HPCTRAIN_CONTROL_DIR": str(ctl), "SLURMD_NODENAME": "n1"}
    for i, lines in enumerate(rounds):
        for rank, step, e in lines:
            if step is not None:
                mark_step(e, step)
            assert failure.write_crash_line(rank, e, {**env, failure.CRASH_ENV: str(ctl / f"round-{i}")})
    script = "\n".join(
        [
            "hpctrain_spares=0 hpctrain_tpn=2",
            shellfile.assign("hpctrain_node_name", NODE_ERE),
            *shellfile.lines("spares.sh"),
            f"hpctrain_max_restarts={max_restarts}",
            *shellfile.lines("restarts.sh"),
            "hpctrain_setup_spares; hpctrain_setup_restarts",
            "hpctrain_rc=1 hpctrain_ended=0",
            f"for i in $(seq 0 {len(rounds) - 1}); do",
            '  rm -f "$HPCTRAIN_CRASH_FILE"; if [ -e "$HPCTRAIN_CONTROL_DIR/round-$i" ]; then',
            '    cp "$HPCTRAIN_CONTROL_DIR/round-$i" "$HPCTRAIN_CRASH_FILE"; fi',
            '  hpctrain_restart_here 2>"$HPCTRAIN_CONTROL_DIR/said-$i"; echo "$?"',
            "done",
        ]
    )
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    return [(int(rc), (ctl / f"said-{i}").read_text()) for i, rc in enumerate(r.stdout.split())]


def test_a_crash_restarts_and_the_first_rank_to_fail_is_the_cause(tmp_path):
    (rc, said), (rc2, said2) = decide(
        tmp_path,
        [
            [(1, 40, RuntimeError("CUDA error: an illegal memory access")), (0, 40, RuntimeError("peer gone"))],
            [(0, 31, RuntimeError("rank(s) 1 stopped responding"))],
        ],
    )
    assert rc == 0 and "with no faulty node: rank 1 on n1 in step 40: RuntimeError: CUDA error" in said, said
    assert "Restart 1/3 in this job on the same nodes" in said
    assert rc2 == 0 and "Restart 2/3" in said2, said2
    faults = (tmp_path / "ctl" / "faults-7").read_text().splitlines()
    assert [f.split("\t")[3] for f in faults] == ["restart", "restart"]
    assert faults[0].split("\t")[5].startswith("exit 1: rank 1 on n1 in step 40: RuntimeError"), faults[0]


def test_the_same_error_at_the_same_step_twice_ends_the_job(tmp_path):
    bug = [(0, 12, ZeroDivisionError("division by zero"))]
    results = decide(tmp_path, [bug, bug])
    assert results[0][0] == 0
    rc, said = results[1]
    assert rc == 1 and "failed twice in a row the same way (exit 1: rank 0 on n1 in step 12: ZeroDivisionError" in said
    assert "A bug, not a fault: not restarting" in said, said
    # a different step is not a loop; a kill (no crash line) twice in a row is
    (tmp_path / "b").mkdir()
    moved = [(0, 13, ZeroDivisionError("division by zero"))]
    assert [rc for rc, _ in decide(tmp_path / "b", [bug, moved, [], []])] == [0, 0, 0, 1]


def test_a_user_error_and_a_spent_budget_end_the_job(tmp_path):
    ((rc, said),) = decide(tmp_path, [[(0, None, UserError("no checkpoint at /x: pass --resume none"))]])
    assert rc == 1 and "A restart cannot fix this" in said and "UserError: no checkpoint" in said, said
    killed: list[tuple] = []  # no rank said why (SIGKILL): the exit status stands for the error
    (tmp_path / "b").mkdir()
    results = decide(tmp_path / "b", [killed, [(1, 5, OSError("EIO"))], killed], max_restarts=2)
    assert [r for r, _ in results] == [0, 0, 1], results
    assert "no rank said why" in results[0][1] and "(slurm.max_restarts=2): not restarting" in results[2][1]


def test_a_transient_user_error_restarts():
    class PeerGone(UserError):  # as train.collective.RankFailure: a collective failed because a peer died
        transient = True

    line = failure.crash_line(0, PeerGone("a collective failed"), "n1", 1)
    assert line.split("\t")[4] == "crash"
    assert failure.crash_line(0, UserError("bad"), "n1", 1).split("\t")[4] == "user"


def test_the_crash_line_has_one_line_and_no_control_characters():
    e = RuntimeError("first\tline\x1b[31m\nsecond line")
    mark_step(e, 9)
    mark_step(e, 3)  # the innermost loop's step stays
    assert step_of(e) == 9
    line = failure.crash_line(2, e, "n7", 123)
    assert line == "123\t2\tn7\t9\tcrash\tRuntimeError: first line [31m\n"

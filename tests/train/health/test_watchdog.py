"""The hang watchdog's parts: the verdict from heartbeats and stacks, stack reading, the NCCL
flight-recorder environment, earlier dumps, and the config rule. The whole watchdog runs in
tests/faults/test_hang.py (3 ranks, one SIGSTOPped)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from hpctrain.cli.common import load_config
from hpctrain.config import ConfigError
from hpctrain.train.health import watchdog as wd

NOW = 1_000_000.0
BACKWARD = "torch/autograd/graph.py:979"
LOADER = "hpctrain/data/torch_loader.py:120"


def stack(rank: int, frame: str) -> str:
    """A stack file as the watchdog writes it: its header, then faulthandler's text."""
    path, line = frame.rsplit(":", 1)
    return (
        f"# hpctrain hang dump: rank {rank} on n{rank} pid 1, last step 10, training thread 0xaa\n"
        "Current thread 0x00000000000000bb (most recent call first):\n"
        '  File "/x/hpctrain/train/health/watchdog.py", line 372 in _dump\n\n'
        "Thread 0x00000000000000aa (most recent call first):\n"
        f'  File "/usr/lib/python3/site-packages/{path}", line {line} in f\n'
        '  File "/x/hpctrain/train/loop.py", line 436 in _run\n'
    )


def hb(rank: int, step: int, age: float = 0.0) -> dict:
    return {"rank": rank, "step": step, "time": NOW - age, "host": f"n{rank}", "state": "dumped"}


def verdict(heartbeats, stacks, files=("/run/logs/stack-rank-0.txt",)):
    return wd.diagnose(heartbeats, stacks, NOW, stale_s=4, timeout_s=5, files=list(files))


def test_a_stopped_rank_is_named_with_no_stack_and_the_others_place():
    files = ["/run/logs/stack-rank-0.txt", "/run/logs/stack-rank-2.txt"]
    line, rec = verdict(
        {0: hb(0, 10), 1: hb(1, 9, age=7), 2: hb(2, 10)}, {0: stack(0, BACKWARD), 1: None, 2: stack(2, BACKWARD)}, files
    )
    assert "\n" not in line and line.startswith("hang: no step completed for 5 s (health.hang_timeout_s)")
    assert "rank(s) 1 behind step 10" in line, line
    assert "rank 1 (last heartbeat 7 s ago at step 9, n1): no stack (process stopped or dead)" in line, line
    assert f"the other ranks wait at {BACKWARD} (rank(s) 0, 2)" in line, line
    assert line.endswith("files in /run/logs: stack-rank-0.txt, stack-rank-2.txt"), line
    assert rec == {"step": 10, "ranks": [1], "where": [None], "files": files}


def test_a_rank_behind_is_named_with_its_frame_and_a_missing_heartbeat_too():
    line, rec = verdict(
        {0: hb(0, 10), 1: hb(1, 9), 2: None, 3: hb(3, 10)},
        {0: stack(0, BACKWARD), 1: stack(1, LOADER), 2: None, 3: stack(3, BACKWARD)},
    )
    assert rec["ranks"] == [1, 2] and rec["where"] == [LOADER, None], rec
    assert f"rank 1 (step 9, n1): {LOADER}" in line and "rank 2 (no heartbeat): no stack" in line, line


def test_same_step_the_rank_away_from_the_others_is_named():
    line, rec = verdict(
        {r: hb(r, 10) for r in range(4)},
        {0: stack(0, BACKWARD), 1: stack(1, BACKWARD), 2: stack(2, LOADER), 3: stack(3, BACKWARD)},
    )
    assert rec["ranks"] == [2] and rec["where"] == [LOADER], rec
    assert f"rank 2 (step 10, n2): {LOADER}" in line and f"wait at {BACKWARD} (rank(s) 0, 1, 3)" in line, line


def test_all_waiting_at_one_place_names_no_rank():
    line, rec = verdict({r: hb(r, 10) for r in range(2)}, {r: stack(r, BACKWARD) for r in range(2)})
    assert rec["ranks"] == [] and rec["step"] == 10
    assert f"every rank at step 10 wait at {BACKWARD} (rank(s) 0, 1)" in line and "behind" not in line, line


def test_a_silent_rank_with_a_fresh_heartbeat_is_not_called_dead():
    line, _ = verdict({0: hb(0, 10), 1: hb(1, 10, age=1)}, {0: stack(0, BACKWARD), 1: None})
    assert "rank 1 (last heartbeat 1 s ago at step 10, n1): no stack (its heartbeat is fresh" in line, line


def test_a_rank_whose_stack_could_not_be_written_is_not_called_silent():
    """Its heartbeat said "dumping" (its stack is on its node) and no stack reached the run
    directory: the file system stalled, not the process."""
    dumping = {**hb(1, 10, age=9), "state": "dumping", "local_stack": "n1:/tmp/hpctrain-stack-rank-1.txt.n1.7"}
    line, rec = verdict({0: hb(0, 10), 1: dumping, 2: hb(2, 9, age=9)}, {0: stack(0, BACKWARD), 1: None, 2: None})
    assert f"rank 1 (step 10, n1): {wd.UNWRITTEN}; kept at n1:/tmp/hpctrain-stack-rank-1.txt.n1.7" in line, line
    assert f"rank 2 (last heartbeat 9 s ago at step 9, n2): {wd.NO_STACK}" in line, line
    assert rec["ranks"] == [1, 2] and rec["unwritten"] == [1], rec


def test_only_silent_ranks_name_their_node_not_those_whose_stack_was_not_written(tmp_path, monkeypatch):
    bad = tmp_path / "bad-nodes"
    monkeypatch.setenv("HPCTRAIN_BAD_NODES_FILE", str(bad))
    logs = tmp_path / "logs"
    logs.mkdir()
    dog = wd.Watchdog(5, 0, 3, logs)  # rank 0 drops an earlier attempt's heartbeats: made first
    for r, state in ((1, "dumping"), (2, "running")):
        (logs / wd.HEARTBEAT.format(r)).write_text(json.dumps({"rank": r, "step": 9, "node": f"n{r}", "state": state}))
    dog._name_silent_nodes({"ranks": [1, 2], "unwritten": [1]})
    lines = bad.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("n2\t") and lines[0].endswith("\tsuspect"), lines


def test_file_work_tells_how_long_a_write_has_waited_and_never_waits_with_it(tmp_path):
    """A write into a FIFO nobody reads waits in the kernel as one to a stalled server does."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    work = wd.FileWork()
    t0 = time.monotonic()
    assert not work.run(lambda: fifo.write_text("x"), 0.3)  # returns: the write still waits
    assert work.busy_s() >= 0.2 and time.monotonic() - t0 < 5
    ticket = work.submit(lambda: None)  # waits behind the stalled write
    assert not work.wait(ticket, 0.1)
    with open(fifo) as reader:  # the "server" answers
        assert work.wait(ticket, 30) and reader.read() == "x"
    assert work.busy_s() == 0.0


def io_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "hpctrain-hang-watchdog-io"]


def test_file_work_thread_ends_when_closed_and_a_stalled_one_when_the_write_returns(tmp_path):
    """A run's exit must leave no thread behind (tests/train/test_exit.py counts them)."""
    before = io_threads()
    work = wd.FileWork()
    assert work.run(lambda: None, 30) and len(io_threads()) == len(before) + 1
    assert work.close(30) and io_threads() == before
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert not work.run(lambda: fifo.write_text("x"), 0.3)  # a new thread, now stalled
    assert not work.close(0.2)  # the stalled write keeps it; close does not wait with it
    with open(fifo) as reader:
        assert reader.read() == "x"
    deadline = time.monotonic() + 30
    while io_threads() != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert io_threads() == before


def test_a_watchdog_that_has_published_leaves_no_thread_after_its_block(tmp_path):
    before = io_threads()
    with wd.Watchdog(1, 0, 1, tmp_path) as dog:
        dog.beat(0)
        deadline = time.monotonic() + 30
        while not (tmp_path / wd.NODE_HEARTBEAT.format(0)).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
            dog.beat(0)
        assert (tmp_path / wd.NODE_HEARTBEAT.format(0)).exists()
        here = dog.node_dir
        assert here is not None and (here / wd.LOCAL_BEAT.format(0)).exists()
    assert io_threads() == before and not (tmp_path / wd.NODE_HEARTBEAT.format(0)).exists()
    assert not here.exists()  # the node-local directory goes with its last rank


def test_many_ranks_stay_one_bounded_line():
    n = 128
    line, rec = verdict(
        {r: (hb(r, 10) if r % 2 else hb(r, 3, age=60)) for r in range(n)},
        {r: (stack(r, BACKWARD) if r % 2 else None) for r in range(n)},
        [f"/run/logs/stack-rank-{r}.txt" for r in range(1, n, 2)],
    )
    assert len(rec["ranks"]) == 64 and len(rec["files"]) == 64
    assert "and 56 more ranks" in line and "and 48 more" in line and len(line) < 2500, len(line)


def parked(ev: threading.Event) -> None:
    while not ev.is_set():
        time.sleep(0.01)  # the innermost Python frame of this thread: this line


def test_stack_file_names_the_training_thread_and_its_innermost_frame(tmp_path):
    ev = threading.Event()
    t = threading.Thread(target=parked, args=(ev,))
    t.start()
    try:
        w = wd.Watchdog(5, 0, 1, tmp_path)
        w._main = t.ident  # the thread `with watchdog:` runs in
        files = w._dump()
    finally:
        ev.set()
        t.join()
    text = (tmp_path / "stack-rank-0.txt").read_text()
    assert files == [str(tmp_path / "stack-rank-0.txt")] and "Current thread" in text
    line = parked.__code__.co_firstlineno + 2
    # not the dumping thread's frame; shortened as every frame is (a checkout named hpctrain/ too)
    assert wd.top_frame(text) == f"{wd.short_path(__file__)}:{line}"
    assert wd.top_frame(text.split("\n", 1)[1]) is None  # no header: no guess
    assert not list(tmp_path.glob("*.tmp"))


def test_short_paths():
    assert wd.short_path("/opt/conda/lib/python3.10/site-packages/torch/nn/x.py") == "torch/nn/x.py"
    assert wd.short_path("/opt/hpctrain-src/hpctrain/train/loop.py") == "hpctrain/train/loop.py"
    assert wd.short_path("<frozen runpy>") == "<frozen runpy>"


def test_flight_recorder_env_for_nccl_only_and_a_jobs_value_wins(tmp_path):
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "500"}
    added = wd.set_flight_recorder_env(env, "nccl", tmp_path / "logs")
    prefix = str(tmp_path / "logs" / "nccl-trace-rank-")
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "500" and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in added
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and env["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == prefix == env["TORCH_FR_DUMP_TEMP_FILE"]
    gloo: dict[str, str] = {}
    assert wd.set_flight_recorder_env(gloo, "gloo", tmp_path / "logs") == {} and gloo == {}


def test_earlier_dumps_are_moved_aside_and_heartbeats_dropped(tmp_path):
    names = ("stack-rank-0.txt", "nccl-trace-rank-1", "hang.json", "heartbeat-rank-0.json", "heartbeat-node-2.json")
    for name in (*names, "rank-0.log"):
        (tmp_path / name).write_text("x")
    dest = wd.archive_previous(tmp_path)
    assert dest is not None and dest.parent == tmp_path and dest.name.startswith("hang-")
    assert sorted(p.name for p in dest.iterdir()) == ["hang.json", "nccl-trace-rank-1", "stack-rank-0.txt"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["rank-0.log"]
    assert wd.archive_previous(tmp_path) is None


def test_hang_timeout_defaults_to_half_the_collective_timeout_and_must_stay_below_it():
    assert load_config("configs/digits_vit.yaml", ["dist.pg_timeout_s=120"]).hang_s == 60
    assert load_config("configs/digits_vit.yaml", ["health.hang_timeout_s=0"]).hang_s == 0
    with pytest.raises(ConfigError, match=r"health.hang_timeout_s=400 must be at most half of dist.pg_timeout_s=600"):
        load_config("configs/digits_vit.yaml", ["health.hang_timeout_s=400"])


STOPPED_WORKER = """
import sys, time
from pathlib import Path
from hpctrain.train.health import watchdog as wd
logs = Path(sys.argv[1])
with wd.Watchdog(2, 0, 1, logs) as dog:
    end = time.monotonic() + float(sys.argv[2])
    step = 0
    while time.monotonic() < end:
        step += 1
        dog.beat(step)
        print(step, flush=True)
        time.sleep(0.05)
"""


def test_a_process_stopped_longer_than_the_hang_timeout_is_not_called_hung_once_continued(tmp_path):
    """SIGSTOP for 3 x the hang timeout (as `scontrol suspend` stops a job's tasks), then SIGCONT: the
    watchdog thread, stopped too, wakes long after its wait; CLOCK_MONOTONIC ran on meanwhile, so by the
    last beat the step took 6 s. It is not a hang: the process goes on and ends 0, with no hang alarm."""
    logs = tmp_path / "logs"
    logs.mkdir()
    p = subprocess.Popen(
        [sys.executable, "-c", STOPPED_WORKER, str(logs), "12"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert p.stdout.readline()  # it beats
        os.kill(p.pid, signal.SIGSTOP)
        time.sleep(6)
        os.kill(p.pid, signal.SIGCONT)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 0 and not (logs / wd.TRIGGER).exists(), err.decode()[-2000:]
    assert b"did not run for" in err and b"the hang clock starts again" in err, err.decode()[-2000:]


def test_the_heartbeat_period_keeps_a_job_within_the_file_systems_budget():
    """One file per node every period: 3 metadata operations (create, rename, stat of hang.json) per node."""
    assert wd.heartbeat_period(2, 5.0) == 5.0  # a small job: the watchdog's tick
    assert wd.heartbeat_period(16, 5.0) == 40.0 and wd.heartbeat_period(128, 5.0) == 320.0
    for nodes in (1, 2, 16, 128, 1000):
        assert nodes * wd.OPS_PER_PUBLISH / wd.heartbeat_period(nodes, 5.0) <= wd.HEARTBEAT_OPS_S < wd.FS_BUDGET_OPS_S
    assert wd.job_nodes(1024, {"SLURM_STEP_NUM_NODES": "128", "SLURM_NNODES": "130"}) == 128
    assert wd.job_nodes(1024, {"LOCAL_WORLD_SIZE": "8"}) == 128  # torchrun
    assert wd.job_nodes(12, {}) == 12  # unknown: as if one rank per node, the longest period
    assert wd.heartbeats_record(300, 1024, {"SLURM_NNODES": "128"}) == {
        "heartbeat_nodes": 128,
        "heartbeat_period_s": 320.0,
    }
    assert wd.heartbeats_record(0, 1024, {}) == {"heartbeat_period_s": None}  # the watchdog off


def test_heartbeats_are_read_from_the_node_files_and_a_ranks_own_newer_one(tmp_path):
    """The verdict reads each node's file (its writer gathered the node's ranks) and the file a rank writes
    as it calls the hang, whichever is newer; a rank in neither has none."""
    node = {"node": "n0", "ranks": {"0": {**hb(0, 7, age=9), "via": "node"}, "1": {**hb(1, 7, age=9), "via": "node"}}}
    (tmp_path / wd.NODE_HEARTBEAT.format(0)).write_text(json.dumps(node))
    (tmp_path / wd.HEARTBEAT.format(1)).write_text(json.dumps(hb(1, 8, age=1)))
    (tmp_path / wd.HEARTBEAT.format(0)).write_text(json.dumps(hb(0, 3, age=20)))  # older than its node's record
    got = wd.read_heartbeats(tmp_path, 3)
    assert got[0]["step"] == 7 and got[0]["via"] == "node" and got[1]["step"] == 8 and got[2] is None
    assert wd.read_heartbeats(tmp_path, 3, ranks=[1]) == {1: got[1]}


def test_the_node_local_directory_is_private_and_keyed_by_the_job_step(tmp_path, hpctrain_log):
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}
    d = wd.node_dir(tmp_path, "n0", env)
    assert d is not None and oct(d.stat().st_mode & 0o777) == "0o700"
    assert wd.node_dir(tmp_path, "n0", env) == d != wd.node_dir(tmp_path, "n1", env)
    assert wd.node_dir(tmp_path, "n0", {**env, "SLURM_STEP_ID": "1"}) != d
    for other in {wd.node_dir(tmp_path, "n1", env), wd.node_dir(tmp_path, "n0", {**env, "SLURM_STEP_ID": "1"})}:
        other.rmdir()
    os.chown(d, 54321, -1)  # another user made the name first (a shared /dev/shm or /tmp)
    try:
        assert wd.node_dir(tmp_path, "n0", env) is None
        assert any("belongs to uid 54321" in r.getMessage() for r in hpctrain_log.records)
    finally:
        d.rmdir()


def test_a_rank_that_writes_no_heartbeat_file_calls_no_hang_while_the_run_directory_stalls(tmp_path, hpctrain_log):
    """The node's second rank writes nothing to the run directory in steady state, so it cannot see a
    stall by its own heartbeat waiting: before it calls a hang it writes its heartbeat there, and a write
    that waits (here behind one into a FIFO nobody reads, as into a stopped server) is a stall, not a hang."""
    logs, fifo = tmp_path / "logs", tmp_path / "fifo"
    logs.mkdir()
    os.mkfifo(fifo)
    dog = wd.Watchdog(1, 1, 2, logs, local_rank=1)
    fired: list[bool] = []
    dog._fire = lambda alarm: fired.append(alarm)  # the real one ends the process
    dog.io.submit(lambda: fifo.write_text("x"))  # the run directory stops answering

    def logged(text: str) -> bool:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(text in r.getMessage() for r in hpctrain_log.records):
            time.sleep(0.05)
        return any(text in r.getMessage() for r in hpctrain_log.records)

    with dog:
        dog.beat(1)
        assert logged("a file-system stall, not a hang") and not fired
        with open(fifo) as reader:  # the server answers
            assert reader.read() == "x"
        assert logged("answered again")

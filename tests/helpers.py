"""Shared test helpers: launch N local ranks (gloo) the way torchrun would."""

from __future__ import annotations

import contextlib
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "configs" / "digits_vit.yaml"


def hpctrain(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """Run this checkout's CLI in a subprocess (text output captured)."""
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        **kw,
    )


def as_typed_at_a_terminal() -> None:
    """`preexec_fn` for a command the test then stops with SIGINT, as a terminal's Ctrl-C would.

    A test run started in the background by a non-interactive shell (`bash .ci/run &`, a CI runner's
    script) ignores SIGINT and SIGQUIT, and every child inherits that (POSIX: without job control an
    asynchronous command ignores both); Python then installs no KeyboardInterrupt handler, and the
    Ctrl-C the test sends is lost. A command typed at a terminal starts with both at their defaults."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def this_python_as(path: Path) -> Path:
    """`path` (e.g. an image's `python3`) made a program that starts this Python, with this Python's
    packages: a script that execs `sys.executable`, not a link to it. Python looks for a venv's
    pyvenv.cfg beside the name it was started by, so a link to a venv's `python` elsewhere starts the
    base interpreter with the base's packages: on a machine whose base Python lacks them (a user's
    venv, README command 1) the task then fails on an import (issue 56: `No module named
    'submitit.core'`, the run directory's submitit/ found as a namespace package)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    path.chmod(0o755)
    return path


# How long a test waits for progress (a step, a job state) before it calls the job stuck: generous,
# since a loaded machine (CI's 2 cores shared with another worker, a noisy neighbour) is slow, and the
# waits end at the event, not at the cap. HPCTRAIN_TEST_WAIT_S changes it.
WAIT_S = float(os.environ.get("HPCTRAIN_TEST_WAIT_S", "900"))


def wait_for(event, what: str, cap_s: float | None = None, show=None, poll_s: float = 0.5):
    """Poll `event()` until it returns something truthy (returned), for at most `cap_s` (WAIT_S).
    On a miss the test fails with `what` and, from `show()`, what the job was doing then (its last
    records, Slurm's rows, the logs' tails): a slow machine passes, a stuck job is explained."""
    cap = WAIT_S if cap_s is None else cap_s
    end = time.monotonic() + cap
    while True:
        got = event()
        if got:
            return got
        if time.monotonic() >= end:
            detail = ""
            if show is not None:
                try:
                    detail = "\n" + str(show())
                except Exception as e:  # noqa: BLE001 - the report must not hide the miss
                    detail = f"\n(no report: {e!r})"
            pytest.fail(f"{what}: not within {cap:.0f} s{detail}", pytrace=False)
        time.sleep(poll_s)


@contextlib.contextmanager
def polling(event, poll_s: float = 0.5):
    """Call `event()` every `poll_s` in a background thread while the block runs (a test that acts on
    the first jobs while it is still submitting the later ones); what it raised (`pytest.fail`
    included) is raised again when the block ends."""
    done, raised = threading.Event(), []

    def loop() -> None:
        while not done.is_set():
            try:
                event()
            except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread below
                raised.append(e)
                return
            done.wait(poll_s)

    thread = threading.Thread(target=loop, name="polling", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
    if raised:
        raise raised[0]


def tails(paths, lines: int = 15) -> str:
    """The last `lines` lines of each file that exists, under its name."""
    out = []
    for p in paths:
        p = Path(p)
        if p.is_file():
            text = p.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {p}\n" + "\n".join(text))
    return "\n".join(out)


def run_report(run_dir: Path, records: int = 8) -> str:
    """What a run was doing: its last metrics records and the tails of its rank logs."""
    run_dir = Path(run_dir)
    last = run_metrics(run_dir)[-records:] if (run_dir / "metrics.jsonl").exists() else []
    return f"run {run_dir}: last records {last}\n" + tails(
        sorted((run_dir / "logs").glob("rank-*.log")) if (run_dir / "logs").is_dir() else []
    )


def dir_files(d: Path) -> dict[str, bytes]:
    """Every plain file directly in `d` by name, with its bytes (packed shards, their index)."""
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def run_metrics(run_dir: Path, kind: str | None = None) -> list[dict]:
    """A run's metrics.jsonl records (of one kind); a line cut mid-write is skipped, so polling a
    live run is safe (hpctrain.run.metrics.read_metrics)."""
    from hpctrain.run.metrics import read_metrics

    return [r for r in read_metrics(Path(run_dir) / "metrics.jsonl") if kind is None or r["kind"] == kind]


# Ports the tests' daemons and rank 0s listen on: below Linux's ephemeral range (32768-60999 by
# default, /proc/sys/net/ipv4/ip_local_port_range), whose ports any outgoing connection may take as
# its source port between the pick and the bind (seen: a test cluster's slurmd "Unable to bind listen
# port … Address already in use"), and below the jobs' own MASTER_PORT range (15000-29999, task.py).
# Each pytest process picks from its own slice, in turn, so that no two picks meet before their
# binds: xdist workers by their number, and sessions that run side by side (.ci/run's stack passes)
# by HPCTRAIN_TEST_PORT_SLOT.
PORTS = range(10000, 15000)
PORT_SLICES = 16  # 2 sessions side by side x 8 workers


def _port_slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    n = int(os.environ.get("HPCTRAIN_TEST_PORT_SLOT", "0")) * 8 + (int(worker) if worker.isdigit() else 0)
    size = len(PORTS) // PORT_SLICES
    return range(PORTS.start + (n % PORT_SLICES) * size, PORTS.start + (n % PORT_SLICES + 1) * size)


_next_port = [random.SystemRandom().randrange(1 << 16)]  # where this process's turn through its slice is


def free_port() -> int:
    """A loopback port of this process's slice of PORTS that nothing listens on now; the next call
    tries the next one (a port is handed out again only after the whole slice has been)."""
    ports = _port_slice()
    for _ in range(len(ports)):
        port = ports[_next_port[0] % len(ports)]
        _next_port[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1}")


def run_ranks(
    world: int,
    argv: list[str],
    timeout: float = 300,
    env: dict | None = None,
    check: bool = True,
    rank_env: list[dict] | None = None,
) -> list[subprocess.CompletedProcess]:
    """Run `python <argv>` as `world` ranks with torchrun-style variables; all must succeed (with `check`).
    `rank_env[r]`: more variables for rank r only (e.g. SLURMD_NODENAME: ranks on different "nodes")."""
    port = free_port()
    procs = []
    for rank in range(world):
        e = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        e.update(env or {})  # may replace the variables above: LOCAL_RANK for ranks on several "nodes"
        e.update(rank_env[rank] if rank_env else {})
        if world == 1:
            for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
                e.pop(k)
        procs.append(
            subprocess.Popen(
                [sys.executable, *argv], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    results = []
    timeout = max(timeout, WAIT_S)  # a bound for a hang, not a timing: a loaded machine is slow
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:  # a hang fails the test and leaves no rank behind
            for q in procs:
                q.kill()
            outs = [q.communicate()[0] for q in procs]
            pytest.fail(
                f"ranks still running after {timeout} s (a hang):\n"
                + "\n".join(f"--- rank {i}\n{o[-2000:]}" for i, o in enumerate(outs))
            )
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, ""))
    for r in results if check else ():
        assert r.returncode == 0, f"rank failed ({r.returncode}):\n{r.stdout[-4000:]}"
    return results


@contextlib.contextmanager
def halt_at(step: int):
    """A run in this process checkpoints and stops at `step` as if preempted (HPCTRAIN_HALT_AT, the
    test knob; `--halt-at=N` among digits_args' items does the same for a subprocess)."""
    old = os.environ.get("HPCTRAIN_HALT_AT")
    os.environ["HPCTRAIN_HALT_AT"] = str(step)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("HPCTRAIN_HALT_AT")
        else:
            os.environ["HPCTRAIN_HALT_AT"] = old


def digits_args(root: Path, run_dir: Path, name: str, *sets: str) -> list[str]:
    """`-m hpctrain train` on the digits config with a tiny, fast schedule."""
    base = [
        f"data.root={root}",
        f"run.dir={run_dir}",
        f"run.name={name}",
        "train.threads=1",
        "log.every=1",
        "train.eval_every_epochs=0",
        "ckpt.every=0",
        "log.trackers=[]",
    ]  # importing TensorBoard costs ~0.5 s CPU per run; its own tests turn it on
    args = ["-m", "hpctrain", "train", "--config", str(DIGITS)]
    for s in (*base, *sets):
        args += [s] if s.startswith("--") else ["--set", s]  # --halt-at=N: a test's halt (HPCTRAIN_HALT_AT)
    return args

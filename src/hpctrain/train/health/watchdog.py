"""Hangs diagnosed, not just timed out: a watchdog thread per rank (docs/observability.md, "Hangs").

The training loop calls `beat(step)` after every completed step: two attribute stores, no
collective, no host sync. A daemon thread writes the step every few seconds to the node's own memory
(/dev/shm, else the node's temp directory: a private directory per job step and node), and the node's
local rank 0 gathers its node's beats into ONE file, `<run>/logs/heartbeat-node-<r>.json`, at a period
that keeps the whole job within FS_BUDGET_OPS_S metadata operations a second on the shared file system
(`heartbeat_period`: 5 s up to 2 nodes, 320 s at 128 nodes; docs/observability.md, "Heartbeats and the
file system's budget"). The hang verdict does not wait for that period: each rank's own clock decides,
and before calling a hang a rank writes its own heartbeat, `heartbeat-rank-<r>.json`, to the run
directory (a stall of the directory shows there). When no step completes for `health.hang_timeout_s`,
or another rank has raised the alarm (`<run>/logs/hang.json`, looked at by each node's writer at its
period; spread to the node's ranks through the node's memory), every live rank writes its Python stacks
(`stack-rank-<r>.txt`) and, on NCCL, the flight recorder (`nccl-trace-rank-<r>`); then each
compares the heartbeats and stack files, logs ONE line naming the ranks behind the highest step or
silent, with the file:line where their training thread stands, and the process exits non-zero.

The watchdog fires before the collectives time out: `health.hang_timeout_s` is at most half of
`dist.pg_timeout_s` (config), so it has that half to dump and compare before a blocked collective
fails; a collective that fails while the watchdog diagnoses waits for it (`stop`).

A stalled file system is not a hang (docs/observability.md, "File-system stalls"). On Lustre or NFS
a write to a server that stopped answering waits in the kernel, unanswered; the training thread
waits in its next metrics line, the other ranks in the collective after it. The watchdog's own
reads and writes of the run directory run on a thread of their own (`FileWork`), so it sees the
stall instead of waiting in it: while a heartbeat has been unwritten for `stall_s`, no rank is
called hung (a restart would meet the same stall); once the directory answers, the stall is an
`fs_stall` record and the hang clock starts again. A stack is written to the node's temp directory
first and then copied: a stack that could not be copied is "not written", never "silent".
"""

from __future__ import annotations

import contextlib
import faulthandler
import hashlib
import itertools
import json
import logging
import os
import re
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as td

from hpctrain.run import badnodes
from hpctrain.run.layout import LOGS, atomic_write, read_json
from hpctrain.run.owner import private_dir
from hpctrain.train.dist import DistInfo

log = logging.getLogger("hpctrain")

EXIT_STATUS = 2  # what the CLI returns for a UserError
HEARTBEAT = "heartbeat-rank-{}.json"  # one rank's, written only as a hang is called (and by a rank without a node dir)
NODE_HEARTBEAT = "heartbeat-node-{}.json"  # a node's ranks, written by its local rank 0 (named by that rank)
LOCAL_BEAT = "rank-{}.json"  # a rank's beat in the node's own memory (node_dir)
LOCAL_ALARM = "alarm"  # in node_dir: a rank of this node fires, or the node's writer saw hang.json
FS_BUDGET_OPS_S = 2.0  # metadata operations a second a whole job may cost the shared file system (issue 55)
# the heartbeats' share of it; the rest: rank 0's stat of the batch shell's end file every
# train.stop.END_FILE_POLL_S (2 s, 0.5 a second) and, with spare nodes, the batch shell's own heartbeat
# (.hpctrain/alive-<job>: written and read by the guard every 10 s, 0.2 a second; launch/shell/guard.sh);
# log files and metrics.jsonl are opened once and cost none
HEARTBEAT_OPS_S = 1.2
OPS_PER_PUBLISH = 3  # a node's publish: create the temp file, rename it over the last one, stat hang.json
STACK = "stack-rank-{}.txt"
NCCL_TRACE = "nccl-trace-rank-"  # TORCH_NCCL_DEBUG_INFO_TEMP_FILE's prefix: torch appends the rank
TRIGGER = "hang.json"
TRACE_BUFFER = "2000"  # flight-recorder entries per rank: the value PyTorch's tutorial recommends
MAX_LISTED = 8  # ranks (and files) spelled out in the one line; the hang record has them all
NO_STACK = "no stack (process stopped or dead)"
UNWRITTEN = "stack not written to the run directory (a file-system stall)"
FS_STALL = "fs_stall"  # the metrics record of a stall the watchdog waited out


# ---------------------------------------------------------------- NCCL flight recorder


def flight_recorder_env(backend: str, logs_dir: Path) -> dict[str, str]:
    """The variables that make NCCL process groups record collectives and dump them into the run's
    logs (none for gloo, which has no flight recorder on the torch versions hpctrain runs).

    Read by ProcessGroupNCCL when it is created, so they are set before init_process_group. The
    TORCH_FR_* spellings are the newer torch's names for the same settings.
    """
    if backend != "nccl":
        return {}
    prefix = str(Path(logs_dir) / NCCL_TRACE)
    return {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": TRACE_BUFFER,
        "TORCH_FR_BUFFER_SIZE": TRACE_BUFFER,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
        "TORCH_FR_DUMP_TEMP_FILE": prefix,
    }


def set_flight_recorder_env(env: MutableMapping[str, str], backend: str, logs_dir: Path) -> dict[str, str]:
    """Set `flight_recorder_env` in `env` where unset (a job's own value wins); returns what was set."""
    added = {k: v for k, v in flight_recorder_env(backend, logs_dir).items() if k not in env}
    env.update(added)
    return added


def dump_nccl_trace(path: Path, timeout_s: float) -> bool:
    """Write this process's flight-recorder buffer (pickled, as torch's own dump) to `path`.

    On a thread of its own, given `timeout_s`: the dump takes the recorder's lock, which a wedged
    NCCL watchdog thread may hold. False when this torch has no such API or nothing came back.
    """
    c10d = torch._C._distributed_c10d
    fn = getattr(c10d, "_dump_nccl_trace", None) or getattr(c10d, "_dump_fr_trace", None)
    if fn is None:
        return False
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["data"] = fn()
        except Exception as e:  # noqa: BLE001 - reported below, never fatal to the diagnosis
            box["error"] = e

    t = threading.Thread(target=run, name="hpctrain-nccl-dump", daemon=True)
    t.start()
    t.join(timeout_s)
    if not box.get("data"):
        log.warning("no NCCL flight-recorder dump: %s", box.get("error") or f"none within {timeout_s:.0f} s")
        return False
    atomic_write(path, box["data"], sync=True)
    return True


# ---------------------------------------------------------------- the heartbeats' budget


def job_nodes(world: int, env: Mapping[str, str] | None = None) -> int:
    """The job step's node count: Slurm's (SLURM_STEP_NUM_NODES, SLURM_JOB_NUM_NODES, SLURM_NNODES), or
    WORLD_SIZE / LOCAL_WORLD_SIZE (torchrun, launch.task); else `world`, one rank per node: the longest
    period, never over the budget."""
    env = os.environ if env is None else env
    for name in ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        if env.get(name, "").isdigit() and int(env[name]) > 0:
            return int(env[name])
    per_node = env.get("LOCAL_WORLD_SIZE", "")
    if per_node.isdigit() and int(per_node) > 0:
        return max(1, -(-world // int(per_node)))
    return max(1, world)


def heartbeat_period(nodes: int, tick_s: float) -> float:
    """Seconds between two publishes of a node's heartbeat file: the watchdog's tick at least, and long
    enough that `nodes` writers make at most HEARTBEAT_OPS_S metadata operations a second together
    (128 nodes × 3 operations / 1.2 per s = 320 s)."""
    return max(tick_s, nodes * OPS_PER_PUBLISH / HEARTBEAT_OPS_S)


def tick(timeout_s: float) -> float:
    """The watchdog thread's tick: a tenth of the hang timeout, between 0.1 s and 5 s."""
    return min(5.0, max(0.1, timeout_s / 10))


def heartbeats_record(timeout_s: float, world: int, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What env.json keeps of the heartbeats ("resolved"): the node count and the node files' period."""
    if timeout_s <= 0:
        return {"heartbeat_period_s": None}
    nodes = job_nodes(world, env)
    return {"heartbeat_nodes": nodes, "heartbeat_period_s": heartbeat_period(nodes, tick(timeout_s))}


def node_dir(logs: Path, node: str, env: Mapping[str, str] | None = None) -> Path | None:
    """The node-local directory where this job step's ranks on this node leave their beats: in /dev/shm
    (memory) where there is one, else the node's temp directory; 0700, this user's (a shared /tmp: anyone
    may make a name first, owner.private_dir). Keyed by the run's logs, the node, the job step and its
    rendezvous: ranks of another step, attempt or run never meet. None where it cannot be made private."""
    env = os.environ if env is None else env
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else Path(tempfile.gettempdir())
    names = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT", "HPCTRAIN_ATTEMPT", "MASTER_ADDR", "MASTER_PORT")
    key = "\0".join([str(Path(logs).resolve()), node, *(env.get(n, "") for n in names)])
    d = base / f"hpctrain-{os.getuid()}-beats-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    why = private_dir(d)
    if why:
        log.warning("hang watchdog: no node-local heartbeats (%s): this rank writes its own to the run directory", why)
        return None
    return d


# ---------------------------------------------------------------- files


def read_heartbeats(logs: Path, world: int, ranks: list[int] | None = None) -> dict[int, dict | None]:
    """Each rank's newest heartbeat (None: none written) of `ranks` (default: all): from the node files
    (one per node; their records say `"via": "node"`) and the rank's own file, written as a hang is
    called, whichever is newer."""
    ranks = list(range(world)) if ranks is None else ranks
    found: dict[int, dict] = {}

    def keep(rec: Any) -> None:
        r = rec.get("rank") if isinstance(rec, dict) else None
        if isinstance(r, int) and (r not in found or float(rec.get("time", 0)) >= float(found[r].get("time", 0))):
            found[r] = rec

    for p in sorted(logs.glob(NODE_HEARTBEAT.format("*"))):
        beats = read_json(p, {}).get("ranks")
        for rec in beats.values() if isinstance(beats, dict) else ():
            keep(rec)
    for r in ranks:
        keep(read_json(logs / HEARTBEAT.format(r), None))
    return {r: found.get(r) for r in ranks}


def read_stacks(logs: Path, world: int) -> dict[int, str | None]:
    out: dict[int, str | None] = {}
    for r in range(world):
        try:
            out[r] = (logs / STACK.format(r)).read_text(errors="replace")
        except OSError:
            out[r] = None
    return out


def dump_files(logs: Path) -> list[Path]:
    """The hang dumps in `logs`: stack files, flight-recorder files, the alarm."""
    found = [*logs.glob(STACK.format("*")), *logs.glob(NCCL_TRACE + "*"), logs / TRIGGER]
    return sorted(p for p in found if p.is_file() and not p.name.endswith(".tmp"))


def archive_previous(logs: Path) -> Path | None:
    """Rank 0 at start: move an earlier attempt's dumps to `logs/hang-<time>/` (kept for the
    reader, never read as this attempt's) and drop old heartbeats. Runs before this rank's first
    step, and every other rank publishes only after its first step, which needs rank 0: so no
    file of this attempt is touched."""
    for p in [*logs.glob(HEARTBEAT.format("*")), *logs.glob(NODE_HEARTBEAT.format("*")), *logs.glob("*.tmp")]:
        p.unlink(missing_ok=True)
    dumps = dump_files(logs) if logs.is_dir() else []
    if not dumps:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(max(p.stat().st_mtime for p in dumps)))
    dest = logs / f"hang-{stamp}"
    dest.mkdir(exist_ok=True)
    for p in dumps:
        os.replace(p, dest / p.name)
    return dest


# ---------------------------------------------------------------- reading stacks


_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+)')
_HEADER = re.compile(r"training thread (0x[0-9a-fA-F]+)")


def short_path(path: str) -> str:
    """A frame's file without the install prefix: `torch/distributed/…`, `hpctrain/train/loop.py`."""
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    i = path.rfind("/hpctrain/")
    return path[i + 1 :] if i >= 0 else path


def top_frame(stack: str) -> str | None:
    """`file:line` of the innermost frame of the training thread in a stack file (the thread named
    in its header line), from faulthandler's text; None when it is not there."""
    m = _HEADER.search(stack.split("\n", 1)[0])
    if not m:
        return None
    want, current = int(m.group(1), 16), None
    for line in stack.splitlines()[1:]:
        t = _THREAD.match(line)
        if t:
            current = int(t.group(1), 16)
            continue
        f = _FRAME.match(line)
        if f and current == want:
            return f"{short_path(f.group(1))}:{f.group(2)}"
    return None


def _listed(items: list[str], what: str) -> str:
    more = len(items) - MAX_LISTED
    return "; ".join(items[:MAX_LISTED]) + (f"; and {more} more {what}" if more > 0 else "")


def _ids(ranks: list[int]) -> str:
    more = len(ranks) - MAX_LISTED
    return ", ".join(map(str, ranks[:MAX_LISTED])) + (f" … {more} more" if more > 0 else "")


def diagnose(
    heartbeats: Mapping[int, dict | None],
    stacks: Mapping[int, str | None],
    now: float,
    stale_s: float,
    timeout_s: float,
    files: list[str],
) -> tuple[str, dict]:
    """The one-line verdict and the `hang` metrics record, from every rank's heartbeat (None: none
    written) and stack-file text (None: none written).

    Named: the ranks behind the highest step and those that wrote no stack (stopped, dead, or too
    wedged to answer), each with where its training thread stands or why that is unknown. When
    every rank answered at the same step, the ranks whose training thread stands somewhere else
    than most (a loader, a lock) are named instead; the line also says where the rest wait. When
    all wait at one place, no rank stands out: the flight-recorder files tell which collective.
    """
    steps = {r: hb["step"] for r, hb in heartbeats.items() if hb and isinstance(hb.get("step"), int)}
    top = max(steps.values(), default=None)
    where = {r: top_frame(text) for r, text in stacks.items() if text}
    named = [r for r in sorted(heartbeats) if stacks.get(r) is None or steps.get(r) != top]
    unwritten = [r for r in named if stacks.get(r) is None and (heartbeats.get(r) or {}).get("state") == "dumping"]
    rest = [r for r in sorted(heartbeats) if r not in named]
    groups: dict[str | None, list[int]] = {}
    for r in rest:
        groups.setdefault(where.get(r), []).append(r)
    order = sorted(groups, key=lambda f: (-len(groups[f]), str(f)))  # the same on every rank
    if not named and len(order) > 1 and 2 * len(groups[order[0]]) > len(rest):
        named = [r for r in rest if where.get(r) != order[0]]
        rest, order = groups[order[0]], order[:1]

    def describe(r: int) -> str:
        hb = heartbeats.get(r)
        if not hb:
            return f"rank {r} (no heartbeat): {NO_STACK}"
        if r in unwritten:
            at = f"; kept at {hb['local_stack']}" if hb.get("local_stack") else ""
            return f"rank {r} (step {hb.get('step')}, {hb.get('host', '?')}): {UNWRITTEN}{at}"
        if stacks.get(r) is None:
            age = now - float(hb.get("time", 0))
            why = NO_STACK if age > stale_s else "no stack (its heartbeat is fresh: wedged, holding the GIL?)"
            return f"rank {r} (last heartbeat {age:.0f} s ago at step {hb.get('step')}, {hb.get('host', '?')}): {why}"
        return f"rank {r} (step {hb.get('step')}, {hb.get('host', '?')}): {where.get(r) or 'no training-thread frame'}"

    parts = [f"hang: no step completed for {timeout_s:g} s (health.hang_timeout_s)"]
    if named:
        parts.append(
            f"rank(s) {_ids(named)} behind step {top}, silent or elsewhere: "
            + _listed([describe(r) for r in named], "ranks")
        )
    if rest:
        at = [f"{f or 'an unknown frame'} (rank(s) {_ids(groups[f])})" for f in order]
        parts.append(f"{'the other ranks' if named else f'every rank at step {top}'} wait at " + _listed(at, "places"))
    names = [Path(f).name for f in files]
    cap = 2 * MAX_LISTED
    listed = ", ".join(names[:cap]) + (f" and {len(names) - cap} more" if len(names) > cap else "")
    parts.append(f"files in {Path(files[0]).parent if files else 'logs'}: {listed or 'none'}")
    record = {"step": top, "ranks": named, "where": [where.get(r) for r in named], "files": list(files)}
    if unwritten:
        record["unwritten"] = unwritten
    return "; ".join(parts), record


# ---------------------------------------------------------------- the run directory's writes


class FileWork:
    """The watchdog's reads and writes of the run directory, one at a time on a thread of their own.

    A write to a stalled Lustre or NFS server waits in the kernel, where Python cannot interrupt
    it: on the watchdog's thread it would stop the watchdog too. Here it stops this thread only,
    and `busy_s()` tells how long the run directory has kept it waiting. A job submitted while
    another runs replaces any job still waiting (only the latest heartbeat matters).
    """

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._next: tuple[int, Callable[[], Any]] | None = None
        self._ids = itertools.count(1)
        self._done = 0
        self._since: float | None = None  # monotonic start of the job running now
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[[], Any]) -> int:
        """Run `fn` next; returns its ticket for `wait`. An OSError of `fn` is logged, not raised."""
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="hpctrain-hang-watchdog-io", daemon=True)
                self._thread.start()
            ticket = next(self._ids)
            self._next = (ticket, fn)
            self._cv.notify_all()
            return ticket

    def wait(self, ticket: int, timeout_s: float) -> bool:
        """True once the job `ticket` (or a later one) has run, False after `timeout_s`."""
        end = time.monotonic() + timeout_s
        with self._cv:
            while self._done < ticket:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
            return True

    def run(self, fn: Callable[[], Any], timeout_s: float) -> bool:
        """`fn` run within `timeout_s` (False: the run directory is still busy with it)."""
        return self.wait(self.submit(fn), timeout_s)

    def busy_s(self) -> float:
        """How long the job running now has been running (0: none runs)."""
        since = self._since
        return 0.0 if since is None else time.monotonic() - since

    def close(self, timeout_s: float) -> bool:
        """End the thread (a job not yet begun is dropped); False when the run directory still
        holds the job running now after `timeout_s` (a daemon thread then, left in the kernel)."""
        with self._cv:
            thread, self._thread, self._next = self._thread, None, None
            if thread is None:
                return True
            self._cv.notify_all()
        thread.join(timeout_s)
        return not thread.is_alive()

    def _loop(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cv:
                while self._next is None and self._thread is me:
                    self._cv.wait()
                job = self._next
                if self._thread is not me or job is None:  # closed
                    return
                (ticket, fn), self._next = job, None
                self._since = time.monotonic()
            try:
                fn()
            except OSError as e:  # a file-system error must not end training
                log.warning("hang watchdog: %s", e)
            finally:
                with self._cv:
                    self._since, self._done = None, ticket
                    self._cv.notify_all()


# ---------------------------------------------------------------- the watchdog


class Watchdog:
    """One per rank; `with watchdog:` around the training loop, `beat(step)` after every step.

    Armed at the first beat: start-up (rendezvous, loaders, a cold torch.compile) is left to the
    process-group timeout, since no sensible hang timeout bounds a first compile.

    How it ends a hung job: the watchdog thread writes everything, then calls `os._exit`. The
    training thread cannot be made to raise: it sits in C++ (a gloo or NCCL wait, a backward's
    all-reduce) that returns only when the collective times out, and an exception set on a
    thread from outside (PyThreadState_SetAsyncExc) is delivered only when that thread runs
    Python again. Aborting the process group is NCCL-only and torch-version dependent.
    `faulthandler.dump_traceback_later(exit=True)` would dump this rank's stacks and exit, but
    without waiting for the other ranks, comparing heartbeats or the NCCL dump, and re-arming
    it per step starts a thread per step. So the line is logged (rank log and console) and
    flushed, rank 0 writes the `hang` record, and the process exits with the CLI's status for
    user errors; nothing of the training state is worth saving from a hung step.
    """

    @classmethod
    def for_run(
        cls, hang_s: float, dist: DistInfo, run_dir: Path | None, report: Callable[[str, dict], None]
    ) -> Watchdog:
        """A rank's watchdog over `run_dir`/logs (none without a run directory); local rank 0 writes
        its node's heartbeats (issue 55); on NCCL a hang dumps the flight recorder too."""
        nccl = td.is_initialized() and td.get_backend() == "nccl"
        logs = run_dir / LOGS if run_dir else None
        return cls(hang_s, dist.rank, dist.world_size, logs, nccl=nccl, report=report, local_rank=dist.local_rank)

    def __init__(
        self,
        timeout_s: float,
        rank: int,
        world: int,
        logs: Path | None,
        nccl: bool = False,
        report: Callable[[str, dict], None] | None = None,
        local_rank: int = 0,
        nodes: int | None = None,
    ):
        self.timeout_s = float(timeout_s) if logs else 0.0
        self.rank, self.world, self.logs, self.nccl, self.report = rank, world, logs, nccl, report
        self.local_rank = local_rank
        self.publish_s = tick(self.timeout_s)  # the thread's tick: a beat in the node's memory
        self.nodes = job_nodes(world) if nodes is None else max(1, nodes)
        self.node_period_s = heartbeat_period(self.nodes, self.publish_s)  # a node file to the run directory
        self.stale_s = 3 * self.publish_s + 1  # a heartbeat older than this: its process is not running
        self.peer_wait_s = min(60.0, max(self.timeout_s / 2, 3 * self.publish_s))
        # a heartbeat (a few hundred bytes) unwritten this long: the run directory stalls
        self.stall_s = max(5.0, 2 * self.publish_s)
        self.io = FileWork()
        self._stalled: float | None = None  # monotonic start of the stall waited out now
        self._clock_from = 0.0  # the hang clock runs from the last beat, the last stall's end or a resume
        self._resumed: float | None = None  # monotonic time this process last ran again after being stopped
        self._alarm = False
        self._local_stack = ""  # host:path of this rank's stack in the node's temp directory
        self.host, self.pid, self.node = socket.gethostname(), os.getpid(), badnodes.this_node()
        self.node_dir: Path | None = None  # set as the thread starts (node_dir)
        self._writer = False  # this rank writes a heartbeat file to the run directory at node_period_s
        self._next_publish = 0.0
        self._wrote_own = False  # heartbeat-rank-<r>.json written (a hang was being called)
        self._entered = 0.0  # wall time the thread started: older node-local alarms are not this attempt's
        self.fired = threading.Event()
        self._step, self._t = -1, None
        self._state, self._files = "running", None
        self._main: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.timeout_s > 0 and rank == 0 and logs and logs.is_dir():
            old = archive_previous(logs)
            if old:
                log.info("an earlier attempt's hang dumps moved to %s", old)

    def beat(self, step: int) -> None:
        """A step completed (the loop's only call: cheap, no collective, no host sync)."""
        self._step = step
        self._t = time.monotonic()

    def __enter__(self) -> Watchdog:
        if self.timeout_s > 0 and self._thread is None:
            self._main = threading.get_ident()
            self._entered = time.time()
            self.node_dir = node_dir(self.logs, self.node) if self.logs else None
            self._writer = self.node_dir is None or self.local_rank == 0
            if self.rank == 0:
                log.info(
                    "hang watchdog: %s node's heartbeats in one file every %.0f s (%d nodes, at most %g metadata "
                    "operations/s on the run directory); a hang is called after %g s without a step",
                    "each" if self.node_dir else "no node-local directory: each rank's own; each",
                    self.node_period_s,
                    self.nodes,
                    HEARTBEAT_OPS_S,
                    self.timeout_s,
                )
            self._thread = threading.Thread(target=self._loop, name="hpctrain-hang-watchdog", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """End the thread. If it is diagnosing a hang (the collective this thread was blocked in may
        have failed meanwhile), wait for it: it ends the process with the diagnosis."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=2 * self.peer_wait_s + 60)
        self._thread = None
        self.io.close(self.stall_s)
        if not self.fired.is_set() and self.logs:
            if self._wrote_own or (self._writer and self.node_dir is None):
                (self.logs / HEARTBEAT.format(self.rank)).unlink(missing_ok=True)
            if self._writer and self.node_dir is not None:
                (self.logs / NODE_HEARTBEAT.format(self.rank)).unlink(missing_ok=True)
        if not self.fired.is_set():
            self._leave_node_dir()

    # ------------------------------------------------------------ thread

    def _loop(self) -> None:
        woke = time.monotonic()
        while not self._stop.wait(self.publish_s):
            slept, woke = time.monotonic() - woke, time.monotonic()
            if slept > self.publish_s + self.stall_s:  # the process was stopped: not the training's time
                self._was_stopped(slept)
                continue
            if self._t is None:
                continue
            self._beat_here()
            busy = self.io.busy_s()
            if self._resumed is not None:  # a write the stop caught midway has not waited that long
                busy = min(busy, woke - self._resumed)
            if busy > self.stall_s:  # the last heartbeat is still unwritten: wait the stall out
                self._stall_began(busy)
                continue
            if self._stalled is not None:
                self._stall_ended()
            if self._writer and woke >= self._next_publish:
                self._next_publish = woke + self.node_period_s
                self.io.submit(self._publish_and_look)
            alarm = self._alarm or self._local_alarm()
            if (alarm or self._overdue()) and self._directory_answers() and (alarm or self._overdue()):
                self._fire(alarm)
                return

    def _overdue(self) -> bool:
        return self._t is not None and time.monotonic() - max(self._t, self._clock_from) > self.timeout_s

    def _directory_answers(self) -> bool:
        """Before a hang is called: this rank's own heartbeat written to the run directory within stall_s.
        A directory that takes no write meanwhile stalls (a file-system stall, not a hang: see the module
        doc); each rank finds it out so, whatever the period of the node files."""
        if self.io.run(lambda: self._publish("running"), self.stall_s):
            return True
        self._stall_began(self.io.busy_s())
        return False

    def _beat_here(self) -> None:
        """This rank's beat in the node's memory, for the node's writer (no shared file system touched)."""
        if self.node_dir is None:
            return
        try:
            atomic_write(self.node_dir / LOCAL_BEAT.format(self.rank), json.dumps(self._record(self._state)))
        except OSError as e:  # e.g. a full /dev/shm: the hang verdict needs none of it
            log.debug("hang watchdog: node-local beat not written: %s", e)

    def _local_alarm(self) -> bool:
        """The node's alarm, raised since this watchdog started (one a killed attempt left is older: every
        rank of this attempt enters its watchdog before the first step, which the others' alarms follow)."""
        if self.node_dir is None:
            return False
        try:
            return os.stat(self.node_dir / LOCAL_ALARM).st_mtime >= self._entered
        except OSError:
            return False

    def _raise_local_alarm(self) -> None:
        if self.node_dir is not None:
            try:
                (self.node_dir / LOCAL_ALARM).touch()
            except OSError as e:
                log.debug("hang watchdog: node-local alarm not raised: %s", e)

    def _was_stopped(self, slept: float) -> None:
        """This thread woke `slept` s after a wait of publish_s: the whole process did not run meanwhile
        (SIGSTOP: `scontrol suspend`, a debugger; or the node itself was stopped). CLOCK_MONOTONIC runs on
        through a SIGSTOP, so without this a resumed rank would call a step hung that was merely stopped.
        The hang clock starts again; the other ranks, stopped with it, do the same."""
        now = time.monotonic()
        self._clock_from, self._resumed = now, now
        log.warning(
            "hang watchdog: this process did not run for %.0f s (stopped: a job suspend?); the hang clock starts again",
            slept,
        )

    def _publish_and_look(self) -> None:
        """The writer's period: the node's beats in one file (or this rank's own), one stat of hang.json."""
        logs = self.logs
        if logs is None:
            return
        if self.node_dir is None:
            self._publish("running")
        else:
            beats = {}
            for p in self.node_dir.glob(LOCAL_BEAT.format("*")):
                rec = read_json(p, None)
                if rec is not None and isinstance(rec.get("rank"), int):
                    beats[str(rec["rank"])] = {**rec, "via": "node"}
            doc = {"node": self.node, "host": self.host, "time": round(time.time(), 3), "ranks": beats}
            atomic_write(logs / NODE_HEARTBEAT.format(self.rank), json.dumps(doc))
        if (logs / TRIGGER).exists():
            self._alarm = True
            self._raise_local_alarm()

    def _stall_began(self, busy: float) -> None:
        if self._stalled is None:
            self._stalled = time.monotonic() - busy
            log.warning(
                "hang watchdog: the run directory %s has taken no write for %.0f s: a file-system stall, "
                "not a hang; waiting for it (no rank is called hung while it lasts)",
                self.logs.parent if self.logs else "?",
                busy,
            )

    def _stall_ended(self) -> None:
        """The run directory answers again: the `fs_stall` record, and the hang clock starts anew
        (the training thread waited in the stall too)."""
        now = time.monotonic()
        seconds, self._stalled, self._clock_from = now - (self._stalled or now), None, now
        log.warning("hang watchdog: the run directory answered again after %.0f s; training goes on", seconds)
        if self.report:
            rec = {"step": self._step, "rank": self.rank, "host": self.host, "seconds": round(seconds, 1)}
            self.report(FS_STALL, rec)

    def _publish(self, state: str, files: list[str] | None = None) -> None:
        """This rank's own heartbeat in the run directory (a hang being called; a rank without a node dir)."""
        self._state, self._files = state, files
        rec = self._record(state, files)
        atomic_write(self.logs / HEARTBEAT.format(self.rank), json.dumps(rec))
        self._wrote_own = True
        self._beat_here()

    def _record(self, state: str, files: list[str] | None = None) -> dict:
        rec = {
            "rank": self.rank,
            "step": self._step,
            "time": round(time.time(), 3),
            "host": self.host,
            "node": self.node,
            "pid": self.pid,
            "state": state,
        }
        if files:
            rec["files"] = files
        if self._local_stack:
            rec["local_stack"] = self._local_stack
        return rec

    def _fire(self, alarm: bool) -> None:
        self.fired.set()
        self._raise_local_alarm()  # the node's other ranks dump now, not at their own clock's end
        try:
            if not alarm:
                trigger = json.dumps({"rank": self.rank, "step": self._step, "time": round(time.time(), 3)})
                self.io.run(lambda: atomic_write(self.logs / TRIGGER, trigger), self.stall_s)
            files = self._dump()
            if files is None:  # this rank's own stack could not be written: the run directory stalls
                log.error(
                    "hang: no step completed for %g s (health.hang_timeout_s), and this rank's stack could not "
                    "be written to %s within %.0f s: the run directory stalls (a file-system stall, not a node "
                    "fault), so no rank or node is named; the stack is at %s",
                    self.timeout_s,
                    self.logs,
                    self.peer_wait_s / 2,
                    self._local_stack,
                )
                return
            self._publish("dumped", files)
            self._wait_for(lambda hb: hb.get("state") in ("dumped", "reported"))
            line, record = diagnose(
                read_heartbeats(self.logs, self.world),
                read_stacks(self.logs, self.world),
                time.time(),
                self.stale_s,
                self.timeout_s,
                [str(p) for p in dump_files(self.logs) if p.name != TRIGGER],
            )
            if self.report:
                self.report("hang", record)
            self._name_silent_nodes(record)
            self._publish("reported", self._files)
            log.error("%s", line)
            if self.rank != 0:  # let rank 0 write the hang record before this exit ends the job step
                self._wait_for(lambda hb: hb.get("state") == "reported", ranks=[0])
        except BaseException:  # noqa: BLE001 - a hung job must end all the same
            log.exception("hang watchdog: the diagnosis failed; exiting anyway")
        finally:
            self._leave_node_dir()
            for h in log.handlers:
                h.flush()
            sys.stderr.flush()
            os._exit(EXIT_STATUS)

    def _leave_node_dir(self) -> None:
        """This rank's beat out of the node's memory, and with the node's last rank the directory (and an
        alarm: every rank of the node has seen it by the time one exits, after waiting for its peers)."""
        if self.node_dir is None:
            return
        (self.node_dir / LOCAL_BEAT.format(self.rank)).unlink(missing_ok=True)
        if self.fired.is_set():
            (self.node_dir / LOCAL_ALARM).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.node_dir.rmdir()  # the node's last rank to end removes it

    def _name_silent_nodes(self, record: dict) -> None:
        """The lowest rank not named tells the batch shell (hpctrain.run.badnodes) the nodes of the named
        ranks that wrote no stack: dead, stopped or wedged processes, whose node the next step
        (on spares) or the requeued job should not use. A rank with a stack that stands elsewhere
        (a loader, a lock) names no node: its node answered; nor does a rank whose stack could not
        be written (its process answered; the file system did not)."""
        named = set(record.get("ranks") or [])
        live = [r for r in range(self.world) if r not in named]
        if not live or self.rank != live[0]:
            return
        heartbeats, stacks = read_heartbeats(self.logs, self.world), read_stacks(self.logs, self.world)
        for r in sorted(named - set(record.get("unwritten") or [])):
            hb = heartbeats.get(r) or {}
            node = hb.get("node") or hb.get("host")
            if stacks.get(r) is None and node:
                try:
                    badnodes.report(
                        str(node),
                        f"rank {r} silent for {self.timeout_s:g} s at step {hb.get('step')} "
                        "(hang watchdog: no stack written)",
                        suspect=True,  # a dead or stopped process on a healthy node looks the same
                    )
                except (OSError, ValueError) as e:
                    log.warning("hang watchdog: could not name node %r of rank %d: %s", node, r, e)

    def _dump(self) -> list[str] | None:
        """This rank's stacks (every thread; the training thread named in the header), then NCCL's.

        Written to the node's temp directory first (it answers when the shared file system does
        not), then copied into the run's logs within peer_wait_s / 2, the heartbeat saying
        "dumping" meanwhile; None when the copy did not finish."""
        local = Path(tempfile.gettempdir()) / f"hpctrain-{STACK.format(self.rank)}.{self.host}.{self.pid}"
        with open(local, "w") as f:
            f.write(
                f"# hpctrain hang dump: rank {self.rank} on {self.host} pid {self.pid}, last step "
                f"{self._step}, training thread 0x{self._main or 0:x}\n"
            )
            f.flush()
            faulthandler.dump_traceback(f, all_threads=True)
        self._local_stack = f"{self.host}:{local}"
        path = self.logs / STACK.format(self.rank)

        def copy() -> None:
            self._publish("dumping")
            atomic_write(path, local.read_bytes(), sync=True)

        if not self.io.run(copy, self.peer_wait_s / 2):
            return None
        files = [str(path)]
        trace = self.logs / f"{NCCL_TRACE}{self.rank}"
        if self.nccl and dump_nccl_trace(trace, min(30.0, self.peer_wait_s / 2)):
            files.append(str(trace))
        return files

    def _wait_for(self, done: Callable[[dict], bool], ranks: list[int] | None = None) -> None:
        """Until every other rank (or `ranks`) is done or silent (its heartbeat stale), at most
        peer_wait_s; this rank's heartbeat stays fresh meanwhile. A rank known only from its node's file
        (or not at all) has not called the hang yet: it is given `grace` to (a live rank's own clock runs
        out within a tick or two of this one's: every rank stopped stepping at once) before it is silent."""
        ranks = [r for r in range(self.world) if r != self.rank] if ranks is None else ranks
        logs = self.logs
        if logs is None:  # no run directory: no watchdog thread, nothing to wait for
            return
        start = time.monotonic()
        end, grace = start + self.peer_wait_s, start + min(self.peer_wait_s, 2 * self.stale_s)

        def settled(hb: dict | None, now: float) -> bool:
            if hb is None or hb.get("via") == "node":
                return time.monotonic() >= grace and (hb is None or now - float(hb.get("time", 0)) > self.stale_s)
            return done(hb) or now - float(hb.get("time", 0)) > self.stale_s

        while time.monotonic() < end:
            hbs = read_heartbeats(logs, self.world, ranks)
            now = time.time()
            if all(settled(hb, now) for hb in hbs.values()):
                return
            self._publish(self._state, self._files)
            time.sleep(self.publish_s / 2)  # every rank reads every heartbeat: keep the file system's load low

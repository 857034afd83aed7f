"""The job's process groups and what the ranks agree on over them: join and leave (`init`, `shutdown`),
unanimous decisions (`agree`, `agree_bits`, `agree_max`, `PendingBits`), and what a failed collective
means (`peer_failure`, `diagnose` → `RankFailure`).

Who is who in the job (rank, world size, the rendezvous address) is train.dist's, read from the
environment alone: the login node imports that module (launch.task, launch.notebook, cli.doctor), so
it imports no torch; this one does.
"""

from __future__ import annotations

import datetime
import gc
import os
import re
import signal
import time
from collections.abc import Callable

import torch
import torch.distributed as td

from hpctrain.errors import UserError
from hpctrain.site.fabric import set_gloo_ifname
from hpctrain.train import stop as stopmod
from hpctrain.train.dist import DistInfo


def init(info: DistInfo, backend: str, timeout_s: int, group_of_one: bool = False) -> None:
    """Join the process group (no-op for one process, unless `group_of_one`: FSDP2 shards over a
    device mesh, which needs a default group, a world of 1 too; it lives in this process alone,
    on an in-memory store, so it opens no port)."""
    if td.is_initialized():
        return
    if info.world_size == 1:
        if group_of_one:
            td.init_process_group(
                backend=backend,
                store=td.HashStore(),
                rank=0,
                world_size=1,
                timeout=datetime.timedelta(seconds=timeout_s),
            )
        return
    # 3 (SkipCleanUp; torch's own default since 2.2, pytorch/pytorch#110723): a failed or timed-out
    # collective ends the process without ncclCommAbort first, which can itself hang on a dead peer
    # (1, TearDown, aborts then ends; its abort can also end the process before the flight
    # recorder's dump is written, pytorch/pytorch#121055). Set explicitly: torchrun sets 1 when unset.
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    set_gloo_ifname()  # before any gloo group: the default one on CPU, the control group on GPU
    td.init_process_group(
        backend=backend,
        init_method=f"tcp://{info.master_addr}:{info.master_port}",
        rank=info.rank,
        world_size=info.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def control_group(timeout_s: int):
    """The gloo group for the CPU tensors ranks agree on (stop, save, fail; the RNG gather, the
    watchdog's rounds), or None where the default group is gloo already (CPU training) or none exists.

    Made whenever a default group that is not gloo exists, a world of one too: NCCL serves only
    `cuda` tensors (a CPU tensor on it: "No backend type associated with device type cpu"), and
    `hpctrain train` with dist.parallel=fsdp on one GPU has an NCCL group of one. One rule for every
    world size keeps the one-GPU path the path of many GPUs (a skip of each collective at a world of
    one would have to be found at every call site, torch's own gathers in checkpoints included)."""
    if not td.is_initialized() or td.get_backend() == "gloo":
        return None
    return td.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))


class RankFailure(UserError, RuntimeError):
    """A collective failed: a rank died or stopped responding. The message names it when known."""

    transient = True  # the peer's fault: the step restarts without it (launch/shell/restarts.sh)


# What gloo and NCCL say when a peer stopped, died or its connection broke (docs/communication.md,
# "When a rank stops"): the text differs with the transport, the torch version and where the
# collective ran (a plain all-reduce, DDP's comm hook, an async work), so it is matched by these
# words, anywhere in the error or the errors it was raised from.
PEER_FAILURE = re.compile(
    "|".join(
        [
            r"gloo",
            r"nccl",  # either library's own file names or messages
            r"pair closure",  # gloo tcp/pair.cc: "Application timeout caused pair closure"
            r"closed by peer",
            r"reset by peer",
            r"broken pipe",  # gloo tcp/pair.cc; the OS's socket errors
            r"timed out waiting",  # gloo tcp/unbound_buffer.cc: "Timed out waiting Nms for recv operation"
            r"collective operation timeout",  # NCCL watchdog: "Watchdog caught collective operation timeout"
            r"communicator was aborted",  # NCCL: "NCCL communicator was aborted on rank N"
            r"connection refused",
            r"socket timeout",  # the store or a transport's connect
        ]
    ),
    re.IGNORECASE,
)


def peer_failure(error: BaseException) -> bool:
    """Whether `error` (or one it was raised from) is a collective that failed for want of a peer."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, td.DistError) or PEER_FAILURE.search(str(e)):
            return True
        e = e.__cause__ or e.__context__
    return False


def step_ending() -> bool:
    """Whether Slurm is ending this step: a SIGTERM came (srun --kill-on-bad-exit once a rank died, a
    preemption, scancel). Its SIGKILL follows KillWait later (30 s by default), so a wait for silent
    ranks would not finish, and the restart would wait for that SIGKILL (docs/faults.md, "Restart")."""
    return any(s == signal.SIGTERM for s, _ in stopmod.STOP.received)


def silent_ranks(
    store, rank: int, world: int, wait_s: float, ending: Callable[[], bool] = lambda: False
) -> list[int] | None:
    """Check in at the rendezvous store; on rank 0, the ranks that did not within `wait_s` (None:
    the store did not answer), or by the time `ending()` says the wait is moot. A timed-out gloo/NCCL
    group is unusable, but the store still works. A check-in is a counter (`add`, in every torch:
    2.2's TCPStore has no `check`), read with `add(0)`."""
    try:
        store.add(f"hpctrain/alive/{rank}", 1)
    except Exception:  # noqa: BLE001 - rank 0 still looks below; another rank: rank 0 is gone
        if rank != 0:
            return None
    if rank != 0:
        return []
    deadline = time.monotonic() + wait_s
    missing, answered = [r for r in range(world) if r != 0], False
    while True:
        try:
            missing = [r for r in missing if store.add(f"hpctrain/alive/{r}", 0) == 0]
            answered = True
        except Exception:  # noqa: BLE001 - a busy store: ask again until the deadline
            pass
        if not missing or time.monotonic() >= deadline or ending():
            return missing if answered else None
        time.sleep(0.2)


def diagnose(error: BaseException, rank: int, world: int, wait_s: float) -> RankFailure:
    """After a failed collective, find the ranks that no longer answer.

    Every live rank checks in at the rendezvous store, and rank 0 names those that do not within
    `wait_s`: "rank(s) N stopped responding", whatever gloo or NCCL said (`PEER_FAILURE`). Not once
    Slurm is ending the step (`step_ending`): then rank 0 ends at once, and the batch shell's restart
    reads the first rank to fail from the crash file (launch/shell/restarts.sh).
    """
    try:
        store = td.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - no default group (it was destroyed): nothing to ask
        store = None
    missing = silent_ranks(store, rank, world, wait_s, step_ending) if store is not None else None
    if step_ending():  # the wait was cut short: a rank still on its way to check in is not silent
        detail = "a collective failed and Slurm is ending the step (a rank died, or the job was stopped)"
    elif missing:
        detail = (
            f"rank(s) {', '.join(map(str, missing))} stopped responding (no reply within the process-group timeout)"
        )
    elif missing is None and rank != 0:
        detail = "rank 0 stopped responding (its rendezvous store is unreachable)"
    else:
        detail = "a collective failed (a rank died or its node is gone)"
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return RankFailure(
        f"{detail}: {first[:300]}. The job stops here; resume from the last checkpoint "
        "with --resume auto (see each rank's log in <run>/logs/)"
    )


def shutdown() -> None:
    """Destroy every process group, last (docs/communication.md, "Exit"). The cyclic garbage is
    collected first: a DDP/FSDP wrapper the caller dropped but a reference cycle keeps would hold
    its group, and that group's gloo threads, past `destroy_process_group` into interpreter exit."""
    if td.is_initialized():
        gc.collect()
        td.destroy_process_group()


def agree_bits(bits: int, group=None) -> int:
    """The bitwise OR of a small non-negative int over all ranks (a MAX per bit; one all-reduce)."""
    if not td.is_initialized():
        return bits
    t = torch.tensor([(bits >> i) & 1 for i in range(8)], dtype=torch.int32)
    td.all_reduce(t, op=td.ReduceOp.MAX, group=group)
    return sum(1 << i for i, v in enumerate(t.tolist()) if v)


class PendingBits:
    """`agree_bits` split in two: `start` posts this rank's bits (a non-blocking all-reduce on a
    gloo group), `result` waits for the OR of every rank's, one call later.

    Started at one step boundary and read at the next, the all-reduce overlaps a whole step
    instead of holding every step up. The answer is deterministic: every rank starts and reads
    the same rounds in the same order (the loop decides both from agreed values only), so every
    rank reads the same OR for the same round. One process: `result` returns the bits as posted.
    """

    def __init__(self, group=None) -> None:
        self.group = group
        self._work = None
        self._tensor = None
        self._bits: int | None = None

    @property
    def pending(self) -> bool:
        return self._bits is not None or self._work is not None

    def start(self, bits: int) -> None:

        if self.pending:
            raise RuntimeError("PendingBits.start: the previous round was never read")
        if not td.is_initialized():
            self._bits = bits
            return
        self._tensor = torch.tensor([(bits >> i) & 1 for i in range(8)], dtype=torch.int32)
        self._work = td.all_reduce(self._tensor, op=td.ReduceOp.MAX, group=self.group, async_op=True)

    def result(self) -> int:
        """The OR of the round started last (0 when none is in flight): waits for it."""
        if self._work is not None:
            work, self._work = self._work, None
            work.wait()
            return sum(1 << i for i, v in enumerate(self._tensor.tolist()) if v)
        bits, self._bits = self._bits or 0, None
        return bits


def agree_max(values: list[float], group=None) -> list[float]:
    """The largest of each value over all ranks (one all-reduce of a CPU float64 tensor on `group`,
    a gloo group: the GPU stream is not synchronised for it); as given with one process."""
    if not td.is_initialized():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64)
    td.all_reduce(t, op=td.ReduceOp.MAX, group=group)
    return t.tolist()


def agree(flag: bool, group=None) -> bool:
    """True on every rank when any rank says so (stop, save, fail): decisions are unanimous.

    `group` must be a gloo group (the default one on CPU, the control group on GPU): the flag is a
    CPU tensor, so the GPU stream is never synchronised for it.
    """
    if not td.is_initialized():
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    td.all_reduce(t, group=group)
    return bool(t.item())

"""A rank that stops or dies is named ("rank(s) N stopped responding"), whatever gloo or NCCL says.

The message of a failed collective differs with the transport, the torch version and where the
collective ran: under load a DDP comm hook's all-reduce said "Application timeout caused pair
closure" where a plain one says "Timed out waiting … for recv operation"; a dead peer is
"Connection closed by peer"; NCCL's watchdog says "collective operation timeout". The real ones
are raised by gloo here; NCCL's come from its source.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from hpctrain.train.collective import peer_failure
from tests.helpers import free_port

WORKER = os.path.join(os.path.dirname(__file__), "peer_worker.py")

# Texts as gloo (third_party/gloo/gloo/transport/tcp/{pair,unbound_buffer}.cc) and NCCL's process
# group (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp) write them, with and without the file
# prefix that some torch builds keep.
PEER_MESSAGES = [
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Application timeout caused pair closure",
    "Application timeout caused pair closure",
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
    "[127.0.0.1]:9104. This is typically caused by a remote worker crashing.",
    "Connection closed by peer [10.0.0.2]:41117",
    "Connection reset by peer",
    "Timed out waiting 4000ms for recv operation to complete",
    "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=41, OpType=ALLREDUCE, "
    "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600023 milliseconds before timing out.",
    "NCCL communicator was aborted on rank 3.",
    "NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled system error",
]
OTHER_MESSAGES = [
    "mat1 and mat2 shapes cannot be multiplied (8x64 and 32x64)",
    "CUDA out of memory. Tried to allocate 2.00 GiB",
    "DataLoader worker (pid 123) is killed by signal: Killed.",
    "train.epochs must be at least 1",
]


@pytest.mark.parametrize("text", PEER_MESSAGES)
def test_every_message_of_a_stopped_peer_is_a_peer_failure(text):
    assert peer_failure(RuntimeError(text))
    try:  # raised while handling it: the loop sees the outer error
        try:
            raise RuntimeError(text)
        except RuntimeError as inner:
            raise RuntimeError("step failed") from inner
    except RuntimeError as outer:
        assert peer_failure(outer)


@pytest.mark.parametrize("text", OTHER_MESSAGES)
def test_a_bug_is_not_a_peer_failure(text):
    assert not peer_failure(RuntimeError(text)) and not peer_failure(ValueError(text))


def run_pair(mode: str, fate: str) -> str:
    """Rank 0's output of the two peer_worker ranks."""
    port = free_port()
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, WORKER, mode, fate, "6"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    try:
        out = procs[0].communicate(timeout=300)[0]  # the group's timeout (6 s) + the 5 s check-in, or a hang
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
            p.communicate()
    return out


@pytest.mark.slow
@pytest.mark.parametrize("mode, fate", [("all-reduce", "stop"), ("ddp-hook", "stop"), ("ddp-hook", "die")])
def test_a_stopped_or_dead_rank_is_named_whatever_gloo_raised(mode, fate):
    out = run_pair(mode, fate)
    assert "peer failure: True" in out, out[-3000:]
    assert "diagnosis: rank(s) 1 stopped responding" in out, out[-3000:]


@pytest.mark.slow
def test_rank_0_does_not_wait_for_the_silent_ranks_once_slurm_ends_the_step():
    """srun --kill-on-bad-exit TERMs the step's tasks once a rank died, and KILLs them KillWait later:
    rank 0 waiting out its check-in (60 s here) would hold the restart until then."""
    out = run_pair("ddp-hook", "ended")
    assert "peer failure: True" in out, out[-3000:]
    assert "diagnosis: a collective failed and Slurm is ending the step" in out, out[-3000:]
    took = float(re.search(r"diagnosed in ([\d.]+) s", out).group(1))
    assert took < 2, out[-3000:]

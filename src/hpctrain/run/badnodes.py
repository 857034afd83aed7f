"""Nodes the tasks found faulty, told to the batch shell that can keep them out.

The task's Python has no Slurm client (docs/architecture.md), so it cannot exclude a node itself. A rank that
names a faulty node — preflight, the hang watchdog's silent rank, a persistent straggler, a rank
that died — appends one line `NODE<TAB>REASON` (`<TAB>suspect` where only a probe can tell the
node from its process) to `$HPCTRAIN_BAD_NODES_FILE` (set by the batch
shell, one file per job). After srun returns, the shell reads the names (`cut -f1`), starts the
next step without them (hot spares) or adds them to the job's ExcNodeList before a requeue.

Node names are Slurm's (`SLURMD_NODENAME`, which `NodeName=` sets and sites may make differ from
the host name), falling back to the host name. Imports no torch: the login node reads it too.
It lives below `launch/` and `train/`: the tasks (train) write the file, the batch shell (launch) reads it.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path

from hpctrain.run.layout import append_line

ENV = "HPCTRAIN_BAD_NODES_FILE"
# What Slurm accepts in a node name, and nothing a shell line or the file's format could trip on.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def this_node(env: Mapping[str, str] | None = None) -> str:
    """This task's Slurm node name (SLURMD_NODENAME), else the host name."""
    env = os.environ if env is None else env
    return env.get("SLURMD_NODENAME") or socket.gethostname()


SUSPECT = "suspect"  # third field: the batch shell excludes the node only if its probe fails too


def report(node: str, reason: str, env: Mapping[str, str] | None = None, suspect: bool = False) -> bool:
    """Append `node` and why to the job's bad-node file; False when there is none (not under an
    hpctrain batch script: nothing would read it). One write with O_APPEND: lines from several
    ranks do not interleave. `suspect`: the evidence does not tell the node from its process (a
    rank that went silent may be a dead process on a healthy node), so the shell's probe of the
    node decides (launch/shell/spares.sh)."""
    env = os.environ if env is None else env
    path = env.get(ENV)
    if not path:
        return False
    if not NODE_NAME.fullmatch(node):
        raise ValueError(f"not a node name: {node!r}")
    append_line(path, f"{node}\t{' '.join(reason.split())}{chr(9) + SUSPECT if suspect else ''}\n")
    return True


# Errors that name the node they struck: its GPU's memory or links failed (CUDA's
# cudaErrorECCUncorrectable "uncorrectable ECC error encountered", cudaErrorNvlinkUncorrectable
# "uncorrectable NVLink error …"; the driver's Xid, a GPU "fallen off the bus"). A restart on that
# node would fail the same way, whatever a probe says next.
HARDWARE_ERRORS = re.compile(r"uncorrectable (?:ECC|NVLink) error|\bXid\b|fallen off the bus|\bGPU is lost\b", re.I)
# NCCL's "unhandled system error" (ncclSystemError: a system call failed, pytorch/pytorch#45950) names
# its host as a suspect only: in containers it is as often a setting of every node (too little shared
# memory, NVIDIA/nccl#473), so the node's probe decides.
SUSPECT_ERRORS = re.compile(r"unhandled system error", re.I)


def report_error(error: str, rank: int, env: Mapping[str, str] | None = None) -> bool:
    """Name this node when a rank's `error` (class and first line) is one that names it (above);
    False when it is not, or when no batch shell reads the file."""
    hardware = HARDWARE_ERRORS.search(error)
    if not hardware and not SUSPECT_ERRORS.search(error):
        return False
    return report(this_node(env), f"rank {rank} failed: {error}", env, suspect=not hardware)


def read(path: str | Path) -> dict[str, str]:
    """{node: first reason given}, in the order reported; malformed lines are skipped."""
    out: dict[str, str] = {}
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        node, _, why = line.partition("\t")
        if NODE_NAME.fullmatch(node) and node not in out:
            out[node] = why.removesuffix(f"\t{SUSPECT}")
    return out

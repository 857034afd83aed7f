"""A job's steps in Slurm accounting: the ones that died OUT_OF_MEMORY, with the rank and node of
their peak memory.

The job's own row (`sacct -X`) does not say why a step died: a rank killed by the cgroup OOM
handler (task/cgroup, ConstrainRAMSpace) leaves that step OUT_OF_MEMORY with ExitCode 0:125 while
the job ends FAILED, or COMPLETED after an in-job restart (launch/shell/restarts.sh). Its step rows
(sacct without -X) do: MaxRSS is the largest resident memory jobacct_gather sampled of one task of
the step, MaxRSSTask that task's id in the step (a training step's task id is its SLURM_PROCID: the
rank), MaxRSSNode its node (sacct(1), fields of Slurm 22.05 and 24.11; docs/observability.md). No torch:
this runs on login nodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hpctrain.site.slurm_cli import tool

FIELDS = ("JobID", "State", "ExitCode", "MaxRSS", "MaxRSSTask", "MaxRSSNode")
OOM = "OUT_OF_MEMORY"
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


@dataclass(frozen=True)
class Step:
    """One step's row: its id (`<job>.<step>`), state, exit code and peak memory."""

    step_id: str
    state: str
    exit_code: str
    max_rss: int | None  # bytes; None when nothing was gathered (JobAcctGatherType=jobacct_gather/none)
    rank: int | None  # the task of the step with that peak
    node: str

    def facts(self) -> dict:
        return {
            "step": self.step_id,
            "state": self.state,
            "exit_code": self.exit_code,
            "max_rss_bytes": self.max_rss,
            "rank": self.rank,
            "node": self.node or None,
        }

    def text(self) -> str:
        """'step 123.0 OUT_OF_MEMORY (exit 0:125), peak 1.2 GiB in rank 1 on n1'."""
        out = f"step {self.step_id} {self.state} (exit {self.exit_code})"
        if self.max_rss:
            where = " on ".join(x for x in (f"rank {self.rank}" if self.rank is not None else "", self.node) if x)
            out += f", peak {size_text(self.max_rss)}" + (f" in {where}" if where else "")
        return out


def parse_steps(text: str) -> list[Step]:
    """`sacct -n -P -o <FIELDS>` output → its step rows (the allocation's own rows are left out)."""
    out = []
    for line in text.splitlines():
        cols = line.split("|")
        if len(cols) != len(FIELDS) or "." not in cols[0]:
            continue
        row = dict(zip(FIELDS, cols))
        task = row["MaxRSSTask"].strip()
        out.append(
            Step(
                row["JobID"],
                (row["State"].split() or ["UNKNOWN"])[0],  # "CANCELLED by 0" → CANCELLED
                row["ExitCode"],
                rss_bytes(row["MaxRSS"]),
                int(task) if task.isdigit() else None,
                row["MaxRSSNode"].strip(),
            )
        )
    return out


def rss_bytes(value: str) -> int | None:
    """sacct's memory figure ('152456K', '1.50G', '0') in bytes; None when empty or unreadable."""
    m = re.fullmatch(r"\s*([0-9.]+)([KMGTP]?)\s*", value or "")
    if not m:
        return None
    try:
        return int(float(m.group(1)) * UNITS[m.group(2)])
    except ValueError:
        return None


def size_text(n: float) -> str:
    """Bytes as '1.2 GiB' or '148 MiB'."""
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.0f} MiB"


def sacct_steps(job_id: str, clusters: str | None = None) -> list[Step]:
    """Every step of every run of the job (requeues included), oldest first, on `clusters` (sacct -M;
    None: the local cluster); [] without sacct."""
    cluster = ["-M", clusters] if clusters else []
    return parse_steps(tool("sacct", "-n", "-P", "-D", *cluster, "-j", str(job_id), "-o", ",".join(FIELDS)) or "")


def oom_steps(steps: list[Step]) -> list[Step]:
    return [s for s in steps if s.state == OOM]

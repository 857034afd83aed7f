"""A job's node count as a range, MIN-MAX (`--nodes 12-16`): Slurm starts such a job as soon as MIN
nodes are free and gives it up to MAX (sbatch(1), --nodes: "If a range is given, the job will be
allocated at least the minimum and at most the maximum"); the training keeps the recipe's global
batch at whatever size it got (docs/launch.md, "Node ranges and fewer nodes"). Torch-free: the
login node parses it for `submit` and `plan`."""

from __future__ import annotations

import re
from dataclasses import dataclass

_RANGE = re.compile(r" *(\d+) *(?:- *(\d+) *)?")  # spaces only: a newline never reaches #SBATCH


@dataclass(frozen=True)
class NodeRange:
    """The fewest and the most nodes a job trains on; equal for a fixed count."""

    lo: int  # the fewest nodes the job starts, or goes on, with
    hi: int  # the most nodes it asks for

    @property
    def fixed(self) -> bool:
        return self.lo == self.hi

    def sbatch(self) -> str:
        """The value of `#SBATCH --nodes`: N, or MIN-MAX."""
        return str(self.hi) if self.fixed else f"{self.lo}-{self.hi}"

    def __str__(self) -> str:
        return self.sbatch()


def parse(text: str, what: str = "--nodes") -> NodeRange:
    """`16` or `12-16`; ValueError with the fix for anything else (a bad range never reaches sbatch)."""
    m = _RANGE.fullmatch(text)
    if not m:
        raise ValueError(f"{what}={text!r}: give a node count (16) or a range MIN-MAX (12-16)")
    lo = int(m.group(1))
    hi = int(m.group(2) or lo)
    if lo < 1:
        raise ValueError(f"{what}={text!r}: a job needs at least one node; use {what} 1 or more (a range: MIN-MAX)")
    if hi < lo:
        raise ValueError(f"{what}={text!r}: MIN is above MAX; use {what} {hi}-{lo}")
    return NodeRange(lo, hi)

"""`<run>/sample_hashes.jsonl` (log.sample_hashes), read: one line per optimizer step, {"step", "epoch",
"n", "hash"}, the hash (16 hex digits) of the step's global sample ids and augmentation seeds
(data.sampling.sample_hashes, summed over the ranks). Two runs trained on the same samples, with the
same augmentation seeds, step for step, where their lines agree, whatever their world sizes.

Rank 0 appends a line after each step; a resume trains again the steps after its checkpoint and
appends their lines again, so a step may have several lines: the last one is the step as the run
kept it (`read_last`). Torch-free: the login node and tests read it.
"""

from __future__ import annotations

import json
from pathlib import Path


def read_last(path: Path) -> dict[int, dict]:
    """step → its last line (a torn last line, from a killed writer, is skipped)."""
    out: dict[int, dict] = {}
    for line in Path(path).read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        out[int(rec["step"])] = rec
    return dict(sorted(out.items()))

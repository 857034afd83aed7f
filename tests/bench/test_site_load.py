"""bench/site_load.py: the inotify counter sees the metadata operations a parallel file system's
metadata server serves, and the extrapolation scales each file family by what it is written per."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

from tests.fs_events import Inotify

ROOT = Path(__file__).resolve().parents[2]


def load_site_load():
    spec = importlib.util.spec_from_file_location("site_load", ROOT / "bench" / "site_load.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["site_load"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_inotify_counts_creates_renames_and_opens_in_new_subdirectories(tmp_path):
    """A heartbeat's temp file + rename in a directory made after the watch began: one create, one
    rename and one open each; a write to a file already open is no metadata operation."""
    watcher = Inotify(tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir()
    time.sleep(0.3)  # the watcher adds the new directory's watch
    with open(tmp_path / "metrics.jsonl", "a") as f:
        for _ in range(5):
            f.write("{}\n")
            f.flush()
    for i in range(3):
        tmp = logs / f".hb-{i}.tmp"
        tmp.write_text("{}")
        os.replace(tmp, logs / f"hb-{i}.json")
    time.sleep(0.3)
    events = watcher.close()
    ops = [(op, path) for _, op, path in events]
    assert ops.count(("open", "metrics.jsonl")) == 1, ops
    assert sum(op == "create" and path.startswith("logs/.hb-") for op, path in ops) == 3, ops
    assert sum(op == "rename" for op, _ in ops) == 3, ops


def test_extrapolation_scales_per_rank_per_node_and_per_job_files():
    """4 ranks on 2 nodes: a family of 4 files grows with the GPUs, one of 2 with the nodes, one file
    stays one; 128 × 8 is their sum at that size."""
    sl = load_site_load()
    events = []
    for t in range(100):  # one op per file per second over 100 s
        events += [(float(t), "create", f"logs/rank-{r}.json") for r in range(4)]
        events += [(float(t), "create", f"logs/node-n{n}.json") for n in (1, 2)]
        events.append((float(t), "open", "metrics.jsonl"))
    fig = sl.fs_figures(events, nodes=2, ranks=4)
    scales = {fam: d["scales_with"] for fam, d in fig["families"].items()}
    assert scales == {"logs/rank-#.json": "rank", "logs/node-n#.json": "node", "metrics.jsonl": "job"}, scales
    # ~1 op/s per file (the steady window is 60 % of the span; its edges add one sample each)
    assert abs(fig["extrapolated"]["128x8"] - (1024 + 128 + 1)) / 1153 < 0.05, fig["extrapolated"]


def test_the_open_of_a_create_is_one_request_and_later_opens_count():
    """A heartbeat's temp file: create + its own open = one request; the batch shell's counter file
    rewritten in place (`echo > file`): every later open counts."""
    sl = load_site_load()
    events = [(0.0, "create", "t.tmp"), (0.0, "open", "t.tmp"), (0.0, "rename", "t.tmp")]
    events += [(0.0, "create", "alive"), (0.0, "open", "alive"), (10.0, "open", "alive"), (20.0, "open", "alive")]
    assert [(op, p) for _, op, p in sl.fused(events)] == [
        ("create", "t.tmp"),
        ("rename", "t.tmp"),
        ("create", "alive"),
        ("open", "alive"),
        ("open", "alive"),
    ]

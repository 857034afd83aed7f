"""Test worker: a rank that times the preflight's node-pair all-reduces over gloo, its node named by
SLURMD_NODENAME, and prints what it led as one JSON line (tests/train/health/test_preflight.py)."""

from __future__ import annotations

import json

import torch
import torch.distributed as td

from hpctrain.run import badnodes
from hpctrain.train import collective, dist
from hpctrain.train.health import preflight


def main() -> None:
    info = dist.detect()
    collective.init(info, "gloo", 120)
    nodes = [None] * info.world_size
    td.all_gather_object(nodes, badnodes.this_node())
    led = preflight.pair_allreduce(nodes, info.rank, torch.device("cpu"), preflight.CPU)
    td.barrier()  # every subgroup destroyed on every rank, the default group still works
    print("PAIRS " + json.dumps(led), flush=True)
    collective.shutdown()


if __name__ == "__main__":
    main()

"""The process groups and the agreements over them: joining (gloo's interface first) and a stop round."""

from __future__ import annotations

import os

import pytest
import torch.distributed as td

from hpctrain.train.collective import PendingBits, init
from hpctrain.train.dist import DistInfo


def test_init_sets_gloo_ifname_before_the_process_group(monkeypatch):
    """The call site: this machine's own /sys/class/net (lo is there, state `unknown`)."""
    seen = {}
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "=lo")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(td, "is_initialized", lambda: False)
    monkeypatch.setattr(
        td, "init_process_group", lambda **kw: seen.setdefault("gloo", os.environ.get("GLOO_SOCKET_IFNAME"))
    )
    init(DistInfo(rank=0, world_size=2), "gloo", 30)
    assert seen == {"gloo": "lo"}
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth9")  # set by the site or the user: kept
    seen.clear()
    init(DistInfo(rank=0, world_size=2), "gloo", 30)
    assert seen == {"gloo": "eth9"}


def test_pending_bits_one_process_reads_what_it_posted_once():
    p = PendingBits()
    assert p.result() == 0 and not p.pending  # nothing in flight
    p.start(0b110)
    assert p.pending
    with pytest.raises(RuntimeError, match="never read"):
        p.start(1)  # rounds never overlap: every rank reads each one before the next
    assert p.result() == 0b110
    assert p.result() == 0 and not p.pending

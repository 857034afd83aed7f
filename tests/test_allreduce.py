"""allreduce.py: the bus-bandwidth measurement `hpctrain doctor --allreduce` runs."""

from __future__ import annotations

import json

import pytest

from hpctrain.allreduce import format_rows, parse_size
from tests.doctor.fake_sysfs import run_cli


@pytest.mark.slow
def test_allreduce_two_gloo_processes(capsys):
    rc, out = run_cli(capsys, "doctor", "--allreduce", "--procs", "2", "--sizes", "4K,64K,1M", "--iters", "3", "--json")
    assert rc == 0
    rep = json.loads(out)
    rows = rep["allreduce"]
    # the table `hpctrain doctor --allreduce` prints
    table = format_rows(rows).splitlines()
    assert table[0] == "all-reduce over 2 ranks (float32 sum)"
    assert table[1].split() == ["size", "time", "(us)", "algbw", "(GB/s)", "busbw", "(GB/s)"]
    assert [ln.split()[0] for ln in table[2:5]] == ["4K", "64K", "1M"]
    assert [row["bytes"] for row in rows] == [4096, 65536, 1 << 20]
    assert all(row["ranks"] == 2 and row["busbw_GBps"] > 0 and row["time_us"] > 0 for row in rows)
    # 2 ranks: bus bandwidth equals algorithm bandwidth (factor 2(n-1)/n = 1)
    assert all(abs(row["busbw_GBps"] - row["algbw_GBps"]) < 1e-12 for row in rows)


def test_allreduce_needs_ranks_and_sizes(capsys):
    from hpctrain.cli import main

    assert main(["doctor", "--allreduce", "--procs", "1"]) == 2
    assert "run under torchrun/srun, or pass --procs 2" in capsys.readouterr().err
    assert main(["doctor", "--allreduce", "--sizes", "12Q"]) == 2
    assert "bad size '12Q'" in capsys.readouterr().err
    assert parse_size("64K") == 65536 and parse_size("1.5M") == 1572864 and parse_size("2G") == 2 << 30

"""`--nodes 16` and `--nodes 12-16`: the parser submit, sweep, eval and plan share, and the request
it becomes (bad input: one line with the fix, before anything reaches sbatch)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpctrain.config import Config
from hpctrain.errors import LaunchError
from hpctrain.launch.submit import Request, plan_job
from hpctrain.node_range import NodeRange, parse
from hpctrain.site.profile import load_profile
from tests.helpers import DIGITS


def test_a_count_and_a_range_parse_to_their_sbatch_value():
    assert parse("16") == NodeRange(16, 16) and parse("16").fixed and parse("16").sbatch() == "16"
    r = parse(" 12 - 16 ")
    assert r == NodeRange(12, 16) and not r.fixed and r.sbatch() == "12-16" == str(r)


@pytest.mark.parametrize(
    "text, fix",
    [
        ("0", "use --nodes 1 or more"),
        ("0-4", "use --nodes 1 or more"),
        ("16-12", "MIN is above MAX; use --nodes 12-16"),
        ("12,16", "give a node count (16) or a range MIN-MAX (12-16)"),
        ("1-15:4", "give a node count (16) or a range MIN-MAX (12-16)"),  # Slurm's step form: not ours
        ("12-16\n", "give a node count (16) or a range MIN-MAX (12-16)"),
    ],
)
def test_bad_node_counts_name_the_fix(text, fix):
    with pytest.raises(ValueError, match=fix.replace("(", r"\(").replace(")", r"\)")):
        parse(text)


def test_a_profiles_min_nodes_makes_a_range_and_a_min_above_max_is_refused():
    profile = load_profile("example-ib", ["slurm.min_nodes=12"])
    plan = plan_job(Config(), profile, Request(nodes=16, gpus_per_node=8), standalone=True)
    assert (plan.min_nodes, plan.nodes, plan.nodes_value(), plan.ranged, plan.no_kill) == (12, 16, "12-16", True, True)
    same = plan_job(Config(), profile, Request(nodes=16, min_nodes=16, gpus_per_node=8), standalone=True)
    assert not same.ranged and same.nodes_value() == "16" and not same.no_kill  # --nodes 16-16: exactly 16
    with pytest.raises(
        LaunchError, match="slurm.min_nodes: the fewest nodes \\(12\\) must be between 1 and the job's 8"
    ):
        plan_job(Config(), profile, Request(nodes=8, gpus_per_node=8), standalone=True)


def test_spares_and_a_range_add_the_spares_to_both_ends():
    profile = load_profile("example-ib")
    plan = plan_job(Config(), profile, Request(nodes=16, min_nodes=12, spare_nodes=1, gpus_per_node=8), standalone=True)
    assert plan.nodes_value() == "13-17" and plan.nodes_text == "12-16"


def test_a_range_the_batch_cannot_split_at_its_most_nodes_is_refused_in_one_line(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpctrain",
            "submit",
            "--cluster",
            "example-ib",
            "--set",
            f"run.dir={tmp_path}",
            "--set",
            "data.global_batch=64",
            "--nodes",
            "4-16",
            "--gpus-per-node",
            "8",
            "--emit-sbatch",
            str(tmp_path / "x"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert "data.global_batch=64" in r.stderr and not (tmp_path / "x").exists(), r.stderr


def test_an_evaluation_refuses_a_range(tmp_path):
    w = tmp_path / "w.pt"
    w.write_bytes(b"")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpctrain",
            "eval",
            "--config",
            DIGITS,
            "--weights",
            str(w),
            "--nodes",
            "2-3",
            "--cluster",
            "example-ib",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and "an evaluation runs on a fixed node count; give --nodes 3" in r.stderr, r.stderr

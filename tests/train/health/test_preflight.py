"""health.preflight: the verdict on gathered figures, DALI's decode on CPU, and gloo ranks on two fake
nodes (SLURMD_NODENAME per rank) with one node slowed by the test-only delay hook."""

from __future__ import annotations

import dataclasses
import json
import re
from types import SimpleNamespace

import pytest
import torch

from hpctrain.config import load
from hpctrain.data.folder import list_split
from hpctrain.flops import peak_tflops
from hpctrain.plan.tables import FABRICS
from hpctrain.run import badnodes
from hpctrain.train.health import preflight
from hpctrain.train.health.straggler import injected_delay
from tests.helpers import ROOT, digits_args, run_metrics, run_ranks

REFS = dict(peak=None, peak_source="", fabric_gbps=None, fabric_source="", min_frac=0.5, tolerance=0.3)


def test_pair_rounds_give_every_node_two_partners():
    assert preflight.pair_rounds(["a"]) == []
    assert preflight.pair_rounds(["a", "b"]) == [[("a", "b")]]
    for n in range(3, 9):
        nodes = [f"n{i}" for i in range(n)]
        rounds = preflight.pair_rounds(nodes)
        for pairing in rounds:  # a round's pairs run at once: no node in two of them
            flat = [x for p in pairing for x in p]
            assert len(flat) == len(set(flat))
        pairs = [frozenset(p) for r in rounds for p in r]
        assert len(pairs) == len(set(pairs))
        for node in nodes:
            partners = {x for p in pairs if node in p for x in p} - {node}
            assert len(partners) == 2, (n, node, partners)


def test_slow_pair_is_put_down_to_the_node_whose_other_pair_is_slow_too():
    nodes = ["n0", "n1", "n2", "n3"]
    pairs = [p for r in preflight.pair_rounds(nodes) for p in r]  # n0+n1, n2+n3, n1+n2, n3+n0
    busbw = {("n0", "n1"): 10.0, ("n2", "n3"): 2.0, ("n1", "n2"): 1.5, ("n3", "n0"): 9.0}
    v = preflight.judge(nodes, [0] * 4, [1.0] * 4, pairs, [busbw[p] for p in pairs], [None] * 4, **REFS)
    assert list(v.bad) == ["n2"] and "n2+n3 2 GB/s busbw" in v.bad["n2"] and "n1+n2 1.5" in v.bad["n2"]
    assert not v.shared and not v.passed
    # a slow pair whose nodes are both fast with another: the link's, nobody is named
    busbw[("n1", "n2")] = 10.0
    v = preflight.judge(nodes, [0] * 4, [1.0] * 4, pairs, [busbw[p] for p in pairs], [None] * 4, **REFS)
    assert v.passed and "n2+n3" in v.notes[0] and "not named" in v.notes[0]


def test_gpu_figures_are_judged_against_the_peak_table_and_all_failing_names_no_node():
    peak, source = peak_tflops("NVIDIA H200")
    refs = dict(REFS, peak=peak, peak_source=source)
    nodes, gpus = ["a", "a", "b", "b"], [0, 1, 0, 1]
    v = preflight.judge(nodes, gpus, [790.0, 780.0, 785.0, 300.0], [], [], [None] * 4, **refs)
    assert list(v.bad) == ["b"] and "rank 3 (GPU 1)" in v.bad["b"] and "0.5 x the 989 TFLOP/s peak" in v.bad["b"]
    # every GPU short of the figure: the figure (or the site's power cap) is wrong, not 2 nodes
    v = preflight.judge(nodes, gpus, [300.0] * 4, [], [], [None] * 4, **refs)
    assert not v.bad and "every rank's matmul is slow" in v.shared[0] and "log.peak_tflops" in v.shared[0]
    line = preflight.failure_line(v, reported=False)
    assert line.startswith("preflight failed, naming no node:") and "\n" not in line


def test_a_matmul_that_raises_names_its_node():
    ecc = "RuntimeError: CUDA error: uncorrectable ECC error encountered"
    peak, source = peak_tflops("NVIDIA H200")
    refs = dict(REFS, peak=peak, peak_source=source)
    v = preflight.judge(
        ["a", "a", "b", "b"],
        [0, 1, 0, 1],
        [790.0, None, 785.0, 780.0],
        [],
        [],
        [None] * 4,
        errors=[None, ecc, None, None],
        **refs,
    )
    assert v.bad == {"a": f"matmul failed on rank 1 (GPU 1): {ecc}"} and not v.shared
    v = preflight.judge(["a", "b"], [0, 0], [None, None], [], [], [None] * 2, errors=[ecc, ecc], **refs)
    assert not v.bad and v.shared == [f"the matmul fails on every rank: {ecc}"]


def test_decode_failure_names_the_node_unless_every_rank_fails():
    nodes = ["a", "b", "c"]
    ok, bad = {"images_per_s": 900.0}, {"error": "RuntimeError: nvImageCodec failure"}
    v = preflight.judge(nodes, [0] * 3, [1.0] * 3, [], [], [ok, bad, ok], **REFS)
    assert list(v.bad) == ["b"] and "DALI decode failed on rank 1" in v.bad["b"]
    line = preflight.failure_line(v, reported=True)
    assert line.startswith("preflight failed: node b: DALI decode failed") and "HPCTRAIN_BAD_NODES_FILE" in line
    v = preflight.judge(nodes, [0] * 3, [1.0] * 3, [], [], [bad] * 3, **REFS)
    assert not v.bad and "on any rank" in v.shared[0]  # the data or the image, not the nodes


def test_fabric_figure_comes_from_the_batch_shells_fabric_kind(monkeypatch):
    t = SimpleNamespace(preflight_busbw_gbps=0.0)
    monkeypatch.setenv(preflight.FABRIC_ENV, "ib")
    assert preflight._fabric_figure(t)[0] == 400.0
    monkeypatch.setenv(preflight.FABRIC_ENV, "carrier-pigeon")
    assert preflight._fabric_figure(t)[0] is None  # the median pair decides
    assert preflight._fabric_figure(SimpleNamespace(preflight_busbw_gbps=90.0)) == (90.0, "health.preflight_busbw_gbps")


def test_the_shipped_batch_script_exports_a_fabric_the_check_knows():
    script = (ROOT / "slurm" / "vit.sbatch").read_text()
    (kind,) = re.findall(r"^export HPCTRAIN_FABRIC=(\S+)", script, re.M)
    assert kind in FABRICS


def test_delay_hook_takes_preflight():
    assert injected_delay(1, {"HPCTRAIN_TEST_DELAY": "1:0.2:preflight"}) == (0.2, "preflight")


def test_on_cpu_a_rank_below_the_mark_is_timed_again_and_keeps_its_best_figure():
    """A busy neighbour can hold a CPU rank back for a whole timing; the rank is timed again while
    any rank is below the mark, and a job whose ranks all pass is not timed twice."""
    tiny = dataclasses.replace(preflight.CPU, matmul_s=0.05, rep_s=0.01)
    tf, retimes = preflight._retimed_on_cpu(1e-9, [1e-9, 1.0, 1.0], None, 0.3, tiny, 0.0, None, 1)
    assert retimes == 1 and tf > 1e-6  # the world of one then passes: no second retime
    assert preflight._retimed_on_cpu(0.5, [0.5, 0.6], None, 0.3, tiny, 0.0, None, 1) == (0.5, 0)
    floor = 0.55  # a reference (log.peak_tflops) is the mark when one is set
    assert preflight._retimed_on_cpu(0.5, [0.5, 0.6], floor, 0.3, tiny, 0.0, None, 1)[1] >= 1


def test_dali_decodes_the_runs_first_images_on_cpu_and_reports_one_it_cannot(digits_root, tmp_path):
    pytest.importorskip("nvidia.dali", reason="DALI: the dali extra (pip install 'hpctrain[dali]')")
    cfg = SimpleNamespace(data=SimpleNamespace(loader="dali"))
    loader = SimpleNamespace(listing=list_split(digits_root, "train"))
    out = preflight.dali_decode(cfg, loader, torch.device("cpu"))
    assert out["images_per_s"] > 0
    (tmp_path / "train" / "x").mkdir(parents=True)
    good = loader.listing.root / loader.listing.samples[0][0]
    (tmp_path / "train" / "x" / "0.png").write_bytes(good.read_bytes()[:60])  # cut short
    out = preflight.dali_decode(cfg, SimpleNamespace(listing=list_split(tmp_path, "train")), torch.device("cpu"))
    assert set(out) == {"error"} and "\n" not in out["error"]
    assert preflight.dali_decode(SimpleNamespace(data=SimpleNamespace(loader="torch")), loader, None) is None


def test_16_node_recipes_turn_it_on():
    assert load("configs/vit_b16_imagenet_4k.yaml").health.preflight
    assert load("configs/vit_b16_imagenet_16k_lamb.yaml").health.preflight
    assert not load("configs/digits_vit.yaml").health.preflight


@pytest.mark.slow
def test_three_nodes_time_three_pairs_in_rounds_over_gloo():
    out = run_ranks(3, ["-m", "tests.train.health.preflight_worker"], rank_env=_nodes("n0", "n1", "n2"), timeout=120)
    led = [json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("PAIRS "))[6:]) for r in out]
    # odd N: (n0,n1), then (n1,n2) and the third round (n2,n0); each pair reported once, by its lowest rank
    assert [[p[:2] for p in r] for r in led] == [[["n0", "n1"], ["n2", "n0"]], [["n1", "n2"]], []]
    assert all(p[2] > 0 for r in led for p in r)


SETS = ("health.preflight=true", "train.max_steps=3", "data.global_batch=16")


def _nodes(*names: str) -> list[dict]:
    return [{"SLURMD_NODENAME": n} for n in names]


@pytest.mark.slow
def test_slowed_node_is_named_and_the_step_fails(digits_root, tmp_path):
    bad_file = tmp_path / "bad-nodes"
    out = run_ranks(
        4,
        # tolerance 0.8: the slowed rank is ~90 % below the median; a healthy one beside stress-ng on 2 cores
        # measured 52 % below after its retries (0.5 named its node too)
        digits_args(digits_root, tmp_path, "r", *SETS, "data.loader=torch", "health.preflight_tolerance=0.8"),
        env={badnodes.ENV: str(bad_file), "HPCTRAIN_TEST_DELAY": "2:1.0:preflight"},
        rank_env=_nodes("n1", "n1", "n2", "n2"),
        check=False,
        timeout=120,
    )
    assert [r.returncode for r in out] == [2] * 4
    assert list(badnodes.read(bad_file)) == ["n2"]
    assert badnodes.read(bad_file)["n2"].startswith("preflight: matmul on rank 2 (GPU 2)")
    for r in out:  # every rank ends with the same one line, naming n2 only
        last = r.stdout.strip().splitlines()[-1]
        assert last.startswith("hpctrain: error: preflight failed: node n2: matmul on rank 2"), r.stdout[-2000:]
        assert "n1" not in last and "HPCTRAIN_BAD_NODES_FILE" in last
    (rec,) = run_metrics(tmp_path / "r", "preflight")
    assert rec["passed"] is False and rec["reported"] is True and list(rec["bad_nodes"]) == ["n2"]
    assert rec["node_of_rank"] == ["n1", "n1", "n2", "n2"] and rec["nodes"] == ["n1", "n2"]
    tf = rec["matmul_tflops"]
    assert len(tf) == 4 and tf[2] < 0.5 * rec["matmul_reference"]["median_tflops"] and min(tf[:2] + tf[3:]) > tf[2]
    assert [p["nodes"] for p in rec["pairs"]] == [["n1", "n2"]] and rec["pairs"][0]["busbw_GBps"] > 0
    assert "not DALI" in rec["notes"][-1]
    assert run_metrics(tmp_path / "r", "train") == []  # no step was taken


@pytest.mark.slow
def test_healthy_nodes_pass_and_training_goes_on(digits_root, tmp_path):
    bad_file = tmp_path / "bad-nodes"
    # the default tolerance (30 %): two ranks sharing a loaded 2-core machine differed by up to ~40 % at
    # their median repetitions; the CPU rate is the fastest repetition's (contention only slows one)
    run_ranks(
        2,
        digits_args(digits_root, tmp_path, "r", *SETS, "data.loader=dali"),
        env={badnodes.ENV: str(bad_file)},
        rank_env=_nodes("n1", "n2"),
        timeout=120,
    )
    assert not bad_file.exists()
    (rec,) = run_metrics(tmp_path / "r", "preflight")
    assert rec["passed"] is True and rec["bad_nodes"] == {} and rec["shared"] == []
    # on a loaded CPU the check may time every rank again (and say so) before it passes: that note only
    assert all(n.startswith("CPU: every rank timed") for n in rec["notes"]), rec["notes"]
    assert all(d["images_per_s"] > 0 for d in rec["decode"]) and len(rec["pairs"]) == 1
    assert rec["nodes"] == ["n1", "n2"] and all(t > 0 for t in rec["matmul_tflops"])
    assert [r["step"] for r in run_metrics(tmp_path / "r", "train")] == [1, 2, 3]
    # the cost of the check on this CPU at each start (docs/preflight.md quotes it; a figure, not a bound)
    print(f"preflight cost on CPU, 2 ranks on 2 nodes with the DALI decode: {rec['seconds']:.2f} s")
    assert rec["seconds"] > 0


@pytest.mark.slow
def test_the_check_runs_again_when_a_run_resumes(digits_root, tmp_path):
    for halt in (2, 0):  # halted at step 2 as if preempted, then resumed
        run_ranks(
            1, digits_args(digits_root, tmp_path, "r", *SETS, "data.loader=torch", f"--halt-at={halt}"), timeout=120
        )
    recs = run_metrics(tmp_path / "r", "preflight")
    assert len(recs) == 2 and all(r["passed"] and "one node: no node pair to time" in r["notes"] for r in recs)
    assert [r["step"] for r in run_metrics(tmp_path / "r", "train")] == [1, 2, 3]

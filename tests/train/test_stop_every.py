"""The stop agreement every K steps (dist.stop_every, train/stop_rounds.py): 4 gloo ranks, 2 per
"node" (SLURMD_NODENAME), K = 3. Every kind of stop still lands on one agreed step on every rank:
a signal is latched by the rank it reaches, posted with the next round (at an agreement boundary)
and acted on when that round is read K steps later; a halt stops exactly at its step; a non-finite
value stops (or rolls back) every rank at the same log boundary, whatever K is.
"""

from __future__ import annotations

import json

import pytest

from hpctrain.config import load
from hpctrain.train.entry import resolved_record
from tests.helpers import DIGITS, digits_args, run_metrics, run_ranks
from tests.train.stop_every_worker import CKPT_EVERY, MAX_STEPS, NAN, ROLLBACK_SIGNAL, SIGNALS, agreed_stop

K = 3
NODES = [{"SLURMD_NODENAME": n} for n in ("n1", "n1", "n2", "n2")]


def _run(digits_root, tmp_path, kind: str, env: dict | None = None) -> list[dict]:
    argv = ["-m", "tests.train.stop_every_worker", str(digits_root), str(tmp_path), kind, str(K)]
    run_ranks(4, argv, timeout=240, env=env, rank_env=NODES)
    return [json.loads((tmp_path / f"result-{r}.json").read_text()) for r in range(4)]


def _one_agreed_step(results: list[dict]) -> dict:
    """Every rank ends alike, at the same step, having begun the same steps."""
    first = results[0]
    for r in results:
        assert r["every"] == K
        assert (r["status"], r.get("stop_kind"), r["step"]) == (first["status"], first.get("stop_kind"), first["step"])
        assert r["began"] == first["began"]
    return first


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(SIGNALS))
def test_each_signal_stops_every_rank_at_one_agreed_step_with_k_above_one(digits_root, tmp_path, kind):
    rank, sent_after, _ = SIGNALS[kind]
    r = _one_agreed_step(_run(digits_root, tmp_path, kind))
    step = agreed_stop(0, K, sent_after)
    assert step < MAX_STEPS and step % K == 0 and step != sent_after + 2  # an agreement boundary, not the next step's
    status = "interrupted" if kind == "interrupt" else "preempted"
    assert (r["status"], r["stop_kind"], r["step"]) == (status, kind, step), (rank, r)
    assert r["began"] == list(range(step))  # no rank took a step past it
    assert [(s["step"], s["stop_kind"]) for s in run_metrics(tmp_path / "run", "stop")] == [(step, kind)]
    ckpts = [c["step"] for c in run_metrics(tmp_path / "run", "checkpoint")]
    trains = run_metrics(tmp_path / "run", "train")
    assert len(trains) == step and all(t["stop_wait_s"] >= 0 for t in trains)  # the wait is on record
    # the periodic saves ran with a round in flight; then the stop's own
    assert ckpts == [s for s in range(CKPT_EVERY, step, CKPT_EVERY)] + [step]


@pytest.mark.slow
def test_a_nonfinite_loss_stops_every_rank_at_its_log_boundary_with_k_above_one(digits_root, tmp_path):
    """The non-finite check is not the stop round: a flag on the device, OR-ed over the ranks in the
    log boundary's all-reduce (log.every=1 here) and before every save, so K does not delay it."""
    nan_step = int(NAN.split(":")[1])
    r = _one_agreed_step(_run(digits_root, tmp_path, "nonfinite", env={"HPCTRAIN_TEST_NAN": NAN}))
    assert (r["status"], r["step"]) == ("diverged", nan_step) and nan_step % K
    assert [(s["step"], s["stop_kind"]) for s in run_metrics(tmp_path / "run", "stop")] == [(nan_step, "nonfinite")]
    assert [c["step"] for c in run_metrics(tmp_path / "run", "checkpoint")] == [CKPT_EVERY]  # nothing saved after it


@pytest.mark.slow
def test_after_a_rollback_the_rounds_restart_at_the_checkpoints_step_on_every_rank(digits_root, tmp_path):
    nan_step = int(NAN.split(":")[1])
    r = _one_agreed_step(_run(digits_root, tmp_path, "rollback", env={"HPCTRAIN_TEST_NAN": NAN}))
    step = agreed_stop(CKPT_EVERY, K, ROLLBACK_SIGNAL)
    assert step < MAX_STEPS
    assert step != agreed_stop(0, K, ROLLBACK_SIGNAL)  # the schedule moved with the rollback
    assert (r["status"], r["stop_kind"], r["step"]) == ("preempted", "time_limit", step)
    assert r["began"] == list(range(nan_step)) + list(range(CKPT_EVERY, step))
    assert [(s["step"], s["stop_kind"]) for s in run_metrics(tmp_path / "run", "stop")] == [(step, "time_limit")]


@pytest.mark.slow
def test_a_halt_between_agreement_boundaries_stops_there_and_env_json_records_k(digits_root, tmp_path):
    halt = 5
    assert halt % K
    sets = (f"dist.stop_every={K}", "train.max_steps=8", f"--halt-at={halt}")
    run_ranks(4, digits_args(digits_root, tmp_path, "h", *sets), timeout=240, rank_env=NODES)
    assert [(s["step"], s["stop_kind"]) for s in run_metrics(tmp_path / "h", "stop")] == [(halt, "halt")]
    assert max(t["step"] for t in run_metrics(tmp_path / "h", "train")) == halt
    env = json.loads((tmp_path / "h" / "env.json").read_text())
    assert env["resolved"]["stop_every"] == K


def test_env_json_records_one_where_nothing_resolved_k():
    assert resolved_record(load(DIGITS), 4)["stop_every"] == 1
    assert resolved_record(load(DIGITS, ["dist.stop_every=7"]), 4)["stop_every"] == 7

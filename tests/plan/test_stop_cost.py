"""How often the ranks agree on a stop (plan.stop_cost): the K that keeps the agreement within 1 % of
the plan's step time, bounded so that a stop still comes within WAIT_MAX_S of steps."""

from __future__ import annotations

import pytest

from hpctrain.config import load
from hpctrain.plan import stop_cost
from hpctrain.plan.ckpt_cost import planned_step_s
from hpctrain.site.profile import load_profile
from tests.helpers import ROOT, hpctrain
from tests.launch.test_sweep_equals_submit import fake_slurm, submitted_config
from tests.plan.test_ckpt_cost import _dry


def _minimal_within_budget(c: stop_cost.StopEvery, ranks: int) -> None:
    """K meets the budget with the round inside half its steps, and K-1 does not (or K is 1)."""
    assert c.cost <= stop_cost.BUDGET and stop_cost.MARGIN * c.round_s <= c.every * c.step_s
    assert c.every * c.step_s <= stop_cost.WAIT_MAX_S
    if c.every > 1:
        k = c.every - 1
        fits = stop_cost.MARGIN * c.round_s <= k * c.step_s
        assert not (fits and stop_cost.cost(k, c.step_s, c.round_s) <= stop_cost.BUDGET)


def test_a_round_is_two_hops_per_rank_of_gloos_ring():
    assert [stop_cost.ring_hops(p) for p in (1, 2, 32, 1024)] == [0, 2, 62, 2046]
    assert stop_cost.round_s(1024, 1e-4) == pytest.approx(2046 * 1e-4)


def test_a_blocking_round_every_step_costs_a_1024_rank_job_more_than_its_step_and_k_fixes_it():
    step = 0.015  # the 15-20 ms step of the 4k recipe on H100s
    assert stop_cost.cost(1, step, stop_cost.round_s(1024)) > 1.0
    c = stop_cost.choose(step, 1024)
    assert c.every > 1 and not c.capped
    _minimal_within_budget(c, 1024)


@pytest.mark.parametrize("step", [0.005, 0.02, 0.25])
@pytest.mark.parametrize("ranks", [2, 8, 128, 1024])
def test_k_is_the_smallest_within_the_budget(step, ranks):
    _minimal_within_budget(stop_cost.choose(step, ranks), ranks)


def test_k_is_held_to_the_wait_bound_when_the_budget_would_need_more():
    c = stop_cost.choose(0.3, 1024, hop_s=1e-3)  # a 2 s round against a 0.3 s step
    assert c.capped and c.every == int(stop_cost.WAIT_MAX_S // 0.3) and c.cost > stop_cost.BUDGET
    assert stop_cost.choose(0.3, 1).every == 1  # one rank: nothing to agree with
    with pytest.raises(ValueError, match="step time"):
        stop_cost.choose(0.0, 8)


def test_a_set_k_is_kept_and_no_plan_means_every_step():
    cfg = load(ROOT / "configs" / "digits_vit.yaml", ["dist.stop_every=5"])
    kept, line = stop_cost.with_stop_every(cfg, 0.001, 1024)
    assert kept.dist.stop_every == 5 and "every 5 steps (dist.stop_every)" in line
    auto = load(ROOT / "configs" / "digits_vit.yaml")
    assert auto.dist.stop_every == 0
    one, line = stop_cost.with_stop_every(auto, None, 16)
    assert one.dist.stop_every == 1 and "every step" in line


def test_the_4k_recipe_on_an_ib_cluster_gets_k_from_its_planned_step_at_16_and_128_nodes():
    cfg = load(ROOT / "configs" / "vit_b16_imagenet_4k.yaml")
    prof = load_profile("example-ib")
    ks = {}
    for nodes in (16, 128):
        step = planned_step_s(cfg, prof, nodes, 8)
        out, line = stop_cost.with_stop_every(cfg, step, nodes * 8)
        c = stop_cost.choose(step, nodes * 8)
        assert out.dist.stop_every == c.every and f"every {c.every} steps" in line
        _minimal_within_budget(c, nodes * 8)
        ks[nodes] = c.every
    # more ranks: a longer round against a shorter step (4 images per GPU at 128 nodes)
    assert 1 < ks[16] < ks[128]


def test_submit_resolves_k_from_its_plan_and_hands_it_to_the_task(slurm_cluster, tmp_path):
    """`submit --dry-run` of a 2-GPU job with 4 images per GPU (a ~3 ms planned step on the `local`
    profile's figures): the line it prints names the K of the plan's step time, the value
    launch.prepare puts in the config the tasks get (env.json's record of it: test_stop_every.py)."""
    sets = ["data.loader=synthetic", "data.global_batch=8"]
    r = _dry(slurm_cluster, tmp_path, slurm_cluster.partition, "--gpus-per-node", "2", "--set", sets[1])
    assert r.returncode == 0, r.stderr
    cfg = load(ROOT / "configs" / "vit_b16_imagenet.yaml", sets)
    step = planned_step_s(cfg, load_profile("local", ["slurm.request_gpus=true"]), 1, 2)
    k = stop_cost.choose(step, 2).every
    assert k > 1 and f"stop agreement: every {k} steps (dist.stop_every)" in r.stdout + r.stderr


def test_the_task_gets_the_planned_k_in_its_config(tmp_path):
    """`submit` to a fake sbatch (tests/launch/test_sweep_equals_submit.py): the config the job's pickle
    carries, what the task trains with and env.json records, has dist.stop_every = the plan's K."""
    sets = ["data.loader=synthetic", "data.global_batch=8"]
    prof = ["slurm.request_gpus=true", "container.runtime=none"]
    r = hpctrain(
        "submit",
        "--config",
        str(ROOT / "configs" / "vit_b16_imagenet.yaml"),
        *[a for s in sets for a in ("--set", s)],
        "--set",
        f"run.dir={tmp_path / 'runs'}",
        "--set",
        "run.name=k",
        "--cluster",
        "local",
        *[a for s in prof for a in ("--cluster-set", s)],
        "--gpus-per-node",
        "2",
        env=fake_slurm(tmp_path),
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    cfg = load(ROOT / "configs" / "vit_b16_imagenet.yaml", sets)
    k = stop_cost.choose(planned_step_s(cfg, load_profile("local", prof), 1, 2), 2).every
    job = submitted_config(tmp_path / "runs" / "k" / "submitit" / "4242_submitted.pkl")
    assert k > 1 and job["dist"]["stop_every"] == k, job["dist"]

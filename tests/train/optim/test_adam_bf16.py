"""optim.mu_dtype=bf16 (train/optim/adamw.py): Adam's first moment stored in bfloat16 as optax's
scale_by_adam(mu_dtype='bfloat16'), checked against the formula written out on random tensors."""

from __future__ import annotations

import io

import pytest
import torch

from hpctrain.config import ConfigError, load
from hpctrain.models.vit import build_vit
from hpctrain.train.optim.adamw import AdamWLowMu
from hpctrain.train.optim.build import build_optimizer
from tests.helpers import DIGITS

LR, B1, B2, EPS, WD = 0.01, 0.9, 0.999, 1e-8, 0.1


def optax_adamw_bf16_mu(w, grads, lr, wd):
    """optax scale_by_adam(mu_dtype=bf16) + decoupled decay, in float64 except the stored moment,
    which is rounded to bf16 after each step (its fp32 value is what the step uses)."""
    w = w.double().clone()
    m_stored = torch.zeros_like(w, dtype=torch.bfloat16)
    v = torch.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        g = g.double()
        m = B1 * m_stored.double() + (1 - B1) * g
        v = B2 * v + (1 - B2) * g * g
        w = w - lr * wd * w - lr * (m / (1 - B1**t)) / (torch.sqrt(v / (1 - B2**t)) + EPS)
        m_stored = m.to(torch.float32).to(torch.bfloat16)
    return w, m_stored


def test_matches_the_formula_and_keeps_the_moment_in_bf16():
    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(7, 5, generator=gen)
    grads = [torch.randn(7, 5, generator=gen) for _ in range(6)]
    p = torch.nn.Parameter(w0.clone())
    opt = AdamWLowMu([p], lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    want_w, want_m = optax_adamw_bf16_mu(w0, grads, LR, WD)
    st = opt.state[p]
    assert st["exp_avg"].dtype == torch.bfloat16 and st["exp_avg_sq"].dtype == torch.float32
    assert p.dtype == torch.float32
    torch.testing.assert_close(p.detach().double(), want_w, rtol=1e-6, atol=1e-6)
    assert torch.equal(st["exp_avg"], want_m)
    # and it is not torch's fp32-moment AdamW: the bf16 rounding moves the weights
    q = torch.nn.Parameter(w0.clone())
    ref = torch.optim.AdamW([q], lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD)
    for g in grads:
        q.grad = g.clone()
        ref.step()
    assert not torch.equal(p.detach(), q.detach())
    torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=1e-3)


def test_state_dict_round_trip_keeps_bf16_and_continues_bit_for_bit():
    gen = torch.Generator().manual_seed(1)
    grads = [torch.randn(4, 3, generator=gen) for _ in range(4)]
    a = torch.nn.Parameter(torch.randn(4, 3, generator=gen))
    b = torch.nn.Parameter(a.detach().clone())
    opt_a = AdamWLowMu([a], lr=LR, weight_decay=WD)
    for g in grads[:2]:
        a.grad = g.clone()
        opt_a.step()
    buf = io.BytesIO()
    torch.save(opt_a.state_dict(), buf)
    buf.seek(0)
    b.data.copy_(a.data)
    opt_b = AdamWLowMu([b], lr=LR, weight_decay=WD)
    opt_b.load_state_dict(torch.load(buf, weights_only=True))
    assert opt_b.state[b]["exp_avg"].dtype == torch.bfloat16
    for g in grads[2:]:
        a.grad, b.grad = g.clone(), g.clone()
        opt_a.step()
        opt_b.step()
    assert torch.equal(a, b) and torch.equal(opt_a.state[a]["exp_avg"], opt_b.state[b]["exp_avg"])


def test_config_picks_it_and_refuses_what_it_cannot_do():
    model = build_vit(load(DIGITS).model)
    cpu = torch.device("cpu")
    assert type(build_optimizer(load(DIGITS), model, cpu)) is torch.optim.AdamW
    opt = build_optimizer(load(DIGITS, ["optim.mu_dtype=bf16"]), model, cpu)
    assert isinstance(opt, AdamWLowMu)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.05, 0.0]  # the same no-decay groups
    with pytest.raises(ConfigError, match="optim.mu_dtype=bf16 is for optim.name=adamw"):
        load(DIGITS, ["optim.mu_dtype=bf16", "optim.name=lamb"])
    with pytest.raises(ConfigError, match="no fused kernel"):
        load(DIGITS, ["optim.mu_dtype=bf16", "optim.fused=always"])


@pytest.mark.slow
def test_exact_resume_with_every_big_vision_option_on(digits_root, tmp_path):
    """2 ranks (sharded checkpoints where torch has them): halt at step 5, resume, equal the straight
    run bit for bit; the checkpointed first moment is bf16; eval runs on the 1 % minival."""
    from hpctrain.data.folder import list_split
    from tests.helpers import digits_args, run_metrics, run_ranks
    from tests.train.test_resume import assert_same, final_state

    sets = [
        "train.max_steps=10",
        "train.ema=0.9",
        "optim.warmup_steps=3",
        "optim.mu_dtype=bf16",
        "model.rep_size=96",
        "model.final_norm=tokens",
        "data.eval_splits=[minival]",
        "aug.mixup=0.2",
        "optim.clip_grad=1.0",
    ]
    run_ranks(2, digits_args(digits_root, tmp_path, "straight", *sets, "run.resume=none"))
    run_ranks(2, digits_args(digits_root, tmp_path, "split", *sets, "--halt-at=5"))
    run_ranks(2, digits_args(digits_root, tmp_path, "split", *sets))
    a, b = final_state(tmp_path / "straight"), final_state(tmp_path / "split")
    assert_same(a, b)
    for st in (a, b):  # the resumed run too: a load must not leave the moment in fp32
        assert {s["exp_avg"].dtype for s in st["optimizer"]["state"].values()} == {torch.bfloat16}
    assert {s["exp_avg_sq"].dtype for s in a["optimizer"]["state"].values()} == {torch.float32}
    assert "pre_logits.fc.weight" in a["model"]
    evals = run_metrics(tmp_path / "straight", "eval")
    n = len(list_split(digits_root, "train"))
    assert evals and evals[-1]["count"] == n - round(0.99 * n) == 14  # digits: 1,438 train images

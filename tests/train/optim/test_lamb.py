"""LAMB (train/optim/lamb.py) against a direct NumPy transcription of You et al. 2020, Algorithm 2, and a
short digits run with it."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from hpctrain.config import load
from hpctrain.models.vit import ViT
from hpctrain.train.optim.lamb import Lamb
from tests.helpers import digits_args, run_metrics, run_ranks

LR, B1, B2, EPS, WD = 0.05, 0.9, 0.999, 1e-6, 0.1


def paper_lamb(x, grads, lr, wd, adapt, steps):
    """Algorithm 2 for one tensor over `steps` gradients, in float64: Adam moments with bias
    correction, r = m̂/(sqrt(v̂)+ε), update r + λx scaled by φ(||x||)/||r + λx|| (φ = identity; 1
    when either norm is 0). `adapt=False`: the plain Adam step (no trust ratio)."""
    x = x.copy()
    m, v = np.zeros_like(x), np.zeros_like(x)
    for t, g in enumerate(grads[:steps], start=1):
        m = B1 * m + (1 - B1) * g
        v = B2 * v + (1 - B2) * g * g
        r = (m / (1 - B1**t)) / (np.sqrt(v / (1 - B2**t)) + EPS)
        u = r + wd * x
        wn, un = np.linalg.norm(x), np.linalg.norm(u)
        ratio = wn / un if (adapt and wn > 0 and un > 0) else 1.0
        x = x - lr * ratio * u
    return x


@pytest.mark.parametrize("always_adapt", [False, True])
def test_lamb_matches_the_papers_update(always_adapt):
    rng = np.random.default_rng(0)
    shapes = {"w": (6, 5), "w0": (4, 3), "b": (5,), "ln": (5,)}
    init = {
        "w": rng.normal(size=shapes["w"]),
        "w0": np.zeros(shapes["w0"]),  # ||w|| = 0: ratio 1
        "b": np.zeros(shapes["b"]),
        "ln": np.ones(shapes["ln"]),
    }
    steps = 4
    grads = {k: [rng.normal(size=s) for _ in range(steps)] for k, s in shapes.items()}
    grads["w0"][0][:] = 0.0  # first step of w0: ||w|| = ||r|| = 0
    params = {k: torch.nn.Parameter(torch.tensor(v, dtype=torch.float64)) for k, v in init.items()}
    opt = Lamb(
        [
            {"params": [params["w"], params["w0"]], "weight_decay": WD},
            {"params": [params["b"], params["ln"]], "weight_decay": 0.0},
        ],
        lr=LR,
        betas=(B1, B2),
        eps=EPS,
        always_adapt=always_adapt,
    )
    for t in range(steps):
        for k, p in params.items():
            p.grad = torch.tensor(grads[k][t], dtype=torch.float64)
        opt.step()
    for k in ("w", "w0"):
        want = paper_lamb(init[k], grads[k], LR, WD, adapt=True, steps=steps)
        np.testing.assert_allclose(params[k].detach().numpy(), want, rtol=1e-10, atol=1e-12)
    for k in ("b", "ln"):  # no weight decay: plain Adam unless always_adapt (the paper's every-layer rule)
        want = paper_lamb(init[k], grads[k], LR, 0.0, adapt=always_adapt, steps=steps)
        np.testing.assert_allclose(params[k].detach().numpy(), want, rtol=1e-10, atol=1e-12)
    # the trust ratio made a difference where it applies: not just Adam
    adam = paper_lamb(init["w"], grads["w"], LR, WD, adapt=False, steps=steps)
    assert not np.allclose(params["w"].detach().numpy(), adam)


def test_lamb_state_round_trips_and_continues_identically():
    torch.manual_seed(0)
    a = torch.nn.Linear(4, 3)
    b = torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    oa, ob = Lamb(a.parameters(), lr=0.01, weight_decay=0.1), Lamb(b.parameters(), lr=0.01, weight_decay=0.1)
    x = torch.randn(8, 4)
    for step in range(3):
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
        if step == 0:  # through a file, as a checkpoint does (weights_only: plain tensors)
            buf = io.BytesIO()
            torch.save(oa.state_dict(), buf)
            buf.seek(0)
            ob.load_state_dict(torch.load(buf, weights_only=True))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.slow
def test_lamb_trains_the_digits_vit(digits_root, tmp_path):
    """40 steps of the digits ViT with LAMB: the loss falls, and the resolved lr is logged and saved."""
    run_ranks(
        1,
        digits_args(
            digits_root,
            tmp_path,
            "lamb",
            "optim.name=lamb",
            "optim.lr=0.015",
            "optim.lr_ref_batch=16",
            "optim.lr_scaling=sqrt",
            "optim.warmup_steps=8",
            "optim.schedule=constant",
            "train.max_steps=40",
            "run.resume=none",
        ),
    )
    losses = [r["loss"] for r in run_metrics(tmp_path / "lamb", "train")]
    assert len(losses) == 40 and np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.04, losses
    resolved = json.loads((tmp_path / "lamb" / "env.json").read_text())["resolved"]
    assert resolved["peak_lr"] == pytest.approx(0.03) and resolved["optimizer"] == "lamb"
    assert resolved["per_rank_batch"] == 64 and "sqrt(64/16)" in resolved["lr_rule"]
    log = (tmp_path / "lamb" / "logs" / "rank-0.log").read_text()
    assert "batch 64 global = 64 per rank x 1 ranks x 1 accumulation steps; lr 0.03 (" in log


def test_lamb_grows_a_zero_head_at_most_1_plus_lr_per_step():
    """Why the LAMB recipe starts from a trunc-normal head (docs/recipes.md, LAMB): from zero the first
    step sets ||w|| = lr_1·||r|| (ratio 1; ||r|| ≈ √numel), then the trust ratio caps each step at
    lr_t·||w||: the norm grows at most (1 + lr_t)× per step. Under a linear warm-up lr_1 is tiny, so after
    50 of 100 warm-up steps to lr 0.01 the zero head is still far below where a trunc-normal(0.02) head
    starts (its first step alone reaches lr/0.02 of that at a constant lr: the warm-up is the problem)."""
    peak, warm, steps = 0.01, 100, 50
    norms = {}
    for init in ("zero", "trunc_normal"):
        torch.manual_seed(0)
        m = ViT(img_size=16, patch_size=8, depth=1, width=32, heads=2, num_classes=10, head_init=init)
        opt = Lamb([{"params": [m.head.weight], "weight_decay": WD}], lr=peak, always_adapt=True)
        x, y = torch.randn(32, 3, 16, 16), torch.randint(0, 10, (32,))
        seq = [m.head.weight.norm().item()]
        for t in range(1, steps + 1):
            opt.param_groups[0]["lr"] = peak * t / warm  # linear warm-up from 0, as optim.warmup_* does
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
            seq.append(m.head.weight.norm().item())
        norms[init] = seq
    zero = norms["zero"]
    assert zero[0] == 0 and zero[1] > 0
    assert all(b <= a * (1 + peak * t / warm) * (1 + 1e-5) for t, a, b in zip(range(2, steps + 1), zero[1:], zero[2:]))
    assert zero[-1] < 0.02 * norms["trunc_normal"][0]  # under 2 % of a trunc-normal head's start, 50 steps in


def test_lamb_recipe_builds_its_sources_model():
    """[CAI] trains timm's vit_base_patch16_224 (trunc-normal head, timm 0.4.12 :305/:382) with drop_rate 0.1."""
    m = load("vit_b16_imagenet_16k_lamb").model
    assert (m.head_init, m.drop_rate, m.attn_drop_rate) == ("trunc_normal", 0.1, 0.0)

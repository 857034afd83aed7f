"""AdamWLowMu and Lamb update with `torch._foreach_*` ops (train/optim/moments.py): each step equals the
per-tensor implementation they replaced, kept here verbatim as the reference, on mixed groups, dtypes,
missing gradients and uneven step counts; the state layout (and so old checkpoints) is unchanged."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hpctrain.train import compat
from hpctrain.train.optim.adamw import AdamWLowMu
from hpctrain.train.optim.lamb import Lamb
from tests.helpers import run_ranks


class PerTensor:
    """The per-tensor loop and updates of train/optim/moments.py, adamw.py and lamb.py before the rewrite."""

    def __init__(self, groups: list[dict], kind: str, mu_dtype: torch.dtype | None = None):
        self.groups, self.kind, self.mu_dtype = groups, kind, mu_dtype
        self.state: dict = {}

    @torch.no_grad()
    def step(self) -> None:
        for group in self.groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state.setdefault(p, {})
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=self.mu_dtype)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                (self.adamw if self.kind == "adamw" else self.lamb)(p, state, group, float(state["step"]))

    @staticmethod
    def adamw(p, state, group, t):
        beta1, beta2 = group["betas"]
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        g = p.grad.float()
        m = state["exp_avg"].float().mul_(beta1).add_(g, alpha=1 - beta1)
        v = state["exp_avg_sq"]
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (v / (1 - beta2**t)).sqrt_().add_(eps)
        if wd:
            p.mul_(1 - lr * wd)
        p.add_((m / (1 - beta1**t)).div_(denom).to(p.dtype), alpha=-lr)
        state["exp_avg"].copy_(m)

    @staticmethod
    def lamb(p, state, group, t):
        beta1, beta2 = group["betas"]
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (v / (1 - beta2**t)).sqrt_().add_(eps)
        r = (m / (1 - beta1**t)).div_(denom)
        if wd:
            r.add_(p, alpha=wd)
        if wd != 0 or group["always_adapt"]:
            w_norm, r_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(r)
            one = torch.ones_like(w_norm)
            r.mul_(torch.where((w_norm > 0) & (r_norm > 0), w_norm / r_norm, one))
        p.add_(r, alpha=-lr)


def tensors(dtypes: list[torch.dtype], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(6, 5), (5,), (3, 4, 2), (1, 3, 4), (7,)]
    out = [torch.randn(s, generator=gen) for s in shapes]
    out[3].zero_()  # ||w|| = 0: LAMB's ratio is 1
    return [t.to(d) for t, d in zip(out, dtypes)]


CASES = {
    "adamw-bf16-mu": ("adamw", [torch.float32] * 5, torch.bfloat16),
    "adamw-fp32-mu": ("adamw", [torch.float32] * 5, torch.float32),
    "adamw-bf16-params": (
        "adamw",
        [torch.float32, torch.bfloat16, torch.float32, torch.bfloat16, torch.float32],
        torch.bfloat16,
    ),
    "lamb-decayed": ("lamb", [torch.float32] * 5, None),
    "lamb-all": ("lamb", [torch.float32, torch.float64, torch.float32, torch.float64, torch.float32], None),
}


@pytest.mark.parametrize("fused", [True, False])  # the CPU's fused kernel (fp32 buckets), or foreach ops only
@pytest.mark.parametrize("chunk", [0, 25])  # 25 values: the CPU's chunks split each group's bucket
@pytest.mark.parametrize("case", list(CASES))
def test_foreach_step_equals_the_per_tensor_update(case, chunk, fused):
    kind, dtypes, mu = CASES[case]
    init = tensors(dtypes, 0)
    new = [torch.nn.Parameter(t.clone()) for t in init]
    old = [torch.nn.Parameter(t.clone()) for t in init]

    def groups(ps, lr):  # two groups, as param_groups makes them; LAMB adapts the second only with "all"
        return [
            {
                "params": ps[:3],
                "lr": lr,
                "betas": (0.9, 0.999),
                "eps": 1e-6,
                "weight_decay": 0.1,
                "always_adapt": case == "lamb-all",
            },
            {
                "params": ps[3:],
                "lr": lr,
                "betas": (0.9, 0.999),
                "eps": 1e-6,
                "weight_decay": 0.0,
                "always_adapt": case == "lamb-all",
            },
        ]

    if kind == "adamw":
        opt = AdamWLowMu(new, lr=0.01, eps=1e-6, weight_decay=0.1, mu_dtype=mu)
        opt.param_groups.clear()
        for g in groups(new, 0.01):
            g.pop("always_adapt")
            opt.add_param_group(g)
    else:
        opt = Lamb(new, lr=0.01, eps=1e-6, weight_decay=0.1)
        opt.param_groups.clear()
        for g in groups(new, 0.01):
            opt.add_param_group(g)
    opt.cpu_chunk, opt.cpu_fused = chunk, fused
    ref = PerTensor(groups(old, 0.01), kind, mu)
    for step in range(6):
        grads = tensors(dtypes, step + 1)
        for i, (p, q) in enumerate(zip(new, old)):
            skip = i == 1 and step in (0, 3)  # no gradient: this tensor's step count falls behind
            p.grad = None if skip else grads[i].clone()
            q.grad = None if skip else grads[i].clone()
        for g in opt.param_groups:  # a schedule changes lr between steps
            g["lr"] = 0.01 * (step + 1) / 6
        for g in ref.groups:
            g["lr"] = 0.01 * (step + 1) / 6
        opt.step()
        ref.step()
    for p, q in zip(new, old):
        assert p.dtype == q.dtype
        torch.testing.assert_close(p.detach(), q.detach())
        st, rt = opt.state[p], ref.state[q]
        assert set(st) == {"step", "exp_avg", "exp_avg_sq"}
        assert st["step"].dtype == torch.float32 and st["step"].device.type == "cpu" and st["step"].ndim == 0
        assert float(st["step"]) == float(rt["step"])
        for k in ("exp_avg", "exp_avg_sq"):
            assert st[k].dtype == rt[k].dtype
            torch.testing.assert_close(st[k], rt[k])
    assert float(opt.state[new[1]]["step"]) == 4  # the uneven counts were exercised
    assert not torch.equal(new[0].detach(), init[0])  # and the parameters moved


class Calls(TorchDispatchMode):
    """The ATen ops a step runs, by name."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.skipif(
    not compat.cpu_fused_adam(),
    reason=f"torch {torch.__version__} has no fused Adam kernel on the "
    "CPU (2.4+): the step keeps the foreach ops, which the equality tests check",
)
@pytest.mark.parametrize("cls", [AdamWLowMu, Lamb])
def test_cpu_fp32_step_takes_torchs_fused_adam_kernel_once_per_chunk(cls):
    """On the CPU the moments and the Adam direction of fp32 tensors come from one fused pass per chunk,
    not from a foreach op per formula line (bench/optim_step.py: 0.4-0.6x torch's foreach AdamW)."""
    params = [torch.nn.Parameter(t) for t in tensors([torch.float32] * 5, 0)]
    opt = cls(params, lr=0.01, weight_decay=0.1)
    opt.cpu_chunk = 25  # the 5 tensors (84 values) in 4 chunks
    for p, g in zip(params, tensors([torch.float32] * 5, 1)):
        p.grad = g
    with Calls() as calls:
        opt.step()
    assert calls.names.count("_fused_adamw_.default") == 4, calls.names
    assert not {"_foreach_sqrt.default", "_foreach_lerp_.Scalar"} & set(calls.names)


@pytest.mark.parametrize("cls", [AdamWLowMu, Lamb])
def test_a_state_dict_written_per_tensor_loads_and_continues_identically(cls):
    """The reference's state (the layout checkpoints before the rewrite hold) loads into the foreach
    optimizer and the next steps equal the reference's own."""
    kind = "adamw" if cls is AdamWLowMu else "lamb"
    mu = torch.bfloat16 if kind == "adamw" else None
    init = tensors([torch.float32] * 5, 0)
    old = [torch.nn.Parameter(t.clone()) for t in init]
    hp = {"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.1}
    ref = PerTensor([{"params": old, **hp, "always_adapt": True}], kind, mu)

    def grads_at(step):
        return tensors([torch.float32] * 5, step + 1)

    for step in range(2):
        for q, g in zip(old, grads_at(step)):
            q.grad = g
        ref.step()
    new = [torch.nn.Parameter(q.detach().clone()) for q in old]
    opt = cls(new, **hp, **({"mu_dtype": mu} if kind == "adamw" else {"always_adapt": True}))
    hyper = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    saved = {
        "state": {i: {k: v.clone() for k, v in ref.state[q].items()} for i, q in enumerate(old)},
        "param_groups": [{**hyper, "params": list(range(5))}],
    }
    opt.load_state_dict(saved)
    for step in range(2, 4):
        for p, q, g in zip(new, old, grads_at(step)):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
    for p, q in zip(new, old):
        torch.testing.assert_close(p.detach(), q.detach())
        assert opt.state[p]["exp_avg"].dtype == ref.state[q]["exp_avg"].dtype


@pytest.mark.slow
@pytest.mark.skipif(
    compat.version_tuple() < compat.FSDP_CPU_MIN_TORCH,
    reason=f"FSDP2 on the CPU needs torch >= 2.6; this is {torch.__version__}",
)
def test_adamw_low_mu_steps_fsdp2_sharded_parameters(tmp_path):
    """optim.mu_dtype=bf16 with dist.parallel=fsdp: the parameters and moments are DTensors, for which
    torch has no `_foreach_copy_` rule; 2 gloo ranks step like the per-tensor reference on whole tensors."""
    run_ranks(2, ["-m", "tests.train.optim.fsdp_optim_worker", str(tmp_path)], timeout=240)
    r = json.loads((tmp_path / "result.json").read_text())
    assert r["kinds"] == ["DTensor"] and r["moments"] == ["torch.bfloat16"]
    assert r["diff"] < 1e-6, r

"""Fast-path switches change the numbers only within their stated tolerance (CPU)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from hpctrain.config import ConfigError, load
from hpctrain.data.synthetic import SyntheticLoader
from hpctrain.models.vit import build_vit
from hpctrain.train import compat, warmup
from hpctrain.train.dist import DistInfo
from hpctrain.train.fastpath import sdpa_backend_used
from hpctrain.train.loop import build_trainer
from hpctrain.train.seeding import step_seed
from tests.helpers import DIGITS

BASE = ["data.loader=synthetic", "optim.warmup_steps=0", "optim.lr=1e-3", "train.threads=0"]


def losses(*sets: str, steps: int = 4) -> list[float]:
    """Losses of `steps` optimizer steps of the digits model on fixed batches, from one init."""
    cfg = load(DIGITS, [*BASE, *sets])
    torch.manual_seed(0)
    model = build_vit(cfg.model)
    loader = SyntheticLoader(
        train=True,
        batch_size=32,
        world=1,
        rank=0,
        size=64,
        img_size=32,
        num_classes=10,
        seed=0,
        device=torch.device("cpu"),
    )
    tr = build_trainer(cfg, DistInfo(), torch.device("cpu"), None, loader, None, model)
    out = []
    for _ in range(steps):
        torch.manual_seed(step_seed(0, tr.step, 0))
        out.append(float(tr.train_step([next(iter(loader))])))
        tr.step += 1
    return out


@pytest.mark.slow
def test_bf16_autocast_matches_fp32_within_tolerance():
    fp32, bf16 = losses("train.amp=none"), losses("train.amp=bf16")
    assert fp32[-1] < fp32[0]  # it learns
    # bf16 keeps 8 bits of mantissa (rel. error 2^-9 per op); the loss over a few steps of a
    # 4-block model stays within 1 % of fp32.
    assert bf16 == pytest.approx(fp32, rel=1e-2)
    assert bf16 != fp32  # autocast really ran in bf16


@pytest.mark.slow
def test_compiled_matches_eager():
    import torch._inductor.config as inductor

    # one block, kernels compiled in this process: a cold CPU compile is the slow part (CONTRIBUTING.md)
    eager = losses("train.amp=none", "model.depth=1", steps=3)
    with inductor.patch(compile_threads=1):
        compiled = losses("train.amp=none", "model.depth=1", "compile.enabled=true", steps=3)
    # Inductor fuses and reorders fp32 reductions: rounding-level differences only.
    assert compiled == pytest.approx(eager, rel=1e-4)


def test_sdpa_backend_is_reported():
    model = build_vit(load(DIGITS).model)
    images = torch.randn(2, 3, 32, 32)
    assert sdpa_backend_used(model, images, contextlib.nullcontext()) == "flash (cpu)"
    assert model.training  # left as it was
    mlp = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 10))
    assert sdpa_backend_used(mlp, images, contextlib.nullcontext()) == "none"


@pytest.fixture
def math_sdpa():
    """The math SDPA kernel forced through the run's own switch (the global flags hold on CPU too)."""
    b = torch.backends.cuda
    names = [n for n in ("flash", "mem_efficient", "math", "cudnn") if hasattr(b, f"{n}_sdp_enabled")]  # 2.2: no cudnn
    was = {n: getattr(b, f"{n}_sdp_enabled")() for n in names}
    compat.set_sdpa_backend("math")
    yield
    for n, on in was.items():
        getattr(b, f"enable_{n}_sdp")(on)


def test_math_sdpa_kernel_is_recognised(math_sdpa):
    # the math kernel reaches the dispatcher only as bmm/softmax (CompositeImplicitAutograd)
    model = build_vit(load(DIGITS).model)
    assert sdpa_backend_used(model, torch.randn(2, 3, 32, 32), contextlib.nullcontext()) == "math"


def test_math_sdpa_kernel_warns_at_start(math_sdpa, hpctrain_log):
    caplog = hpctrain_log
    cfg = load(DIGITS, BASE)
    loader = SyntheticLoader(
        train=True,
        batch_size=32,
        world=1,
        rank=0,
        size=64,
        img_size=32,
        num_classes=10,
        seed=0,
        device=torch.device("cpu"),
    )
    tr = build_trainer(cfg, DistInfo(), torch.device("cpu"), None, loader, None, build_vit(cfg.model))
    with caplog.at_level("INFO", logger="hpctrain"):
        warmup.log_attention_kernel(tr.model, cfg, torch.device("cpu"))
    assert [r.levelname for r in caplog.records if "math SDPA kernel" in r.getMessage()] == ["WARNING"]


def test_switches_are_config_fields():
    cfg = load(
        DIGITS,
        [
            "train.tf32=false",
            "train.sdpa_backend=cudnn",
            "train.amp=bf16",
            "dist.ddp_bucket_mb=100",
            "dist.ddp_bucket_view=false",
            "dist.fsdp_reshard=false",
        ],
    )
    t, d = cfg.train, cfg.dist
    assert (t.tf32, t.sdpa_backend, d.ddp_bucket_mb, d.ddp_bucket_view, d.fsdp_reshard) == (
        False,
        "cudnn",
        100,
        False,
        False,
    )
    with pytest.raises(ValueError, match="sdpa_backend"):
        load(DIGITS, ["train.sdpa_backend=flashy"])


@pytest.mark.parametrize("backend", ["flash", "cudnn"])
def test_half_precision_sdpa_kernel_without_amp_is_refused(backend):
    # flash and cuDNN attention take fp16/bf16 only, and choosing one turns math off: fp32 q/k/v
    # would fail the first forward with "No available kernel" (docs/observability.md)
    with pytest.raises(
        ConfigError,
        match=rf"^train\.sdpa_backend={backend} with train\.amp=none cannot run: .*"
        r"set train\.amp=bf16",
    ):
        load(DIGITS, ["train.amp=none", f"train.sdpa_backend={backend}"])
    for ok in (["train.amp=bf16"], ["train.amp=fp16"], ["train.amp=none", "train.device=cpu"]):
        assert load(DIGITS, [*ok, f"train.sdpa_backend={backend}"]).train.sdpa_backend == backend
    assert load(DIGITS, ["train.amp=none", "train.sdpa_backend=efficient"]).train.amp == "none"  # fp32 kernel

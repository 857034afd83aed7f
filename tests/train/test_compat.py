"""What differs between the supported torch versions: each API is picked by what the running torch
has, and FSDP on a torch without FSDP2 fails with one line before anything starts.

Runs in the main CI pass (newest torch) and in every image-stack pass (.ci/stack: torch 2.2.2 for the default
image's PyTorch); the tests that only mean something on one side say so when they skip.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hpctrain.config import ConfigError, load
from hpctrain.data.synthetic import SyntheticLoader
from hpctrain.models.vit import build_vit
from hpctrain.train import compat
from hpctrain.train.ckpt import checkpoint as ckpt
from hpctrain.train.dist import DistInfo
from hpctrain.train.loop import Trainer, build_trainer
from hpctrain.train.seeding import step_seed
from tests.helpers import DIGITS, ROOT, digits_args, free_port

HAS_FSDP2 = compat.version_tuple() >= compat.FSDP_MIN_TORCH
HAS_CPU_FSDP = compat.version_tuple() >= compat.FSDP_CPU_MIN_TORCH  # FSDP2 on the CPU, where these tests run
FSDP_LINE = re.compile(
    r"dist\.parallel=fsdp (on the CPU )?needs torch >= 2\.[46][^;]*; this is \S+: use "
    r"dist\.parallel=ddp"
)


@pytest.mark.parametrize(
    "version, refused",
    [
        ("2.2.0a0+81ea7a4", True),  # NGC 23.12
        ("2.2.2+cu121", True),
        ("2.3.1", True),
        ("2.4.0", False),
        ("2.5.1+cu124", False),
        ("2.13.0+cpu", False),
    ],
)
def test_fsdp_version_gate(version, refused):
    compat.check_parallel("ddp", version)  # DDP runs on every supported torch
    if not refused:
        compat.check_parallel("fsdp", version)
        return
    with pytest.raises(ConfigError) as e:
        compat.check_parallel("fsdp", version)
    msg = str(e.value)
    assert FSDP_LINE.fullmatch(msg.split(" (")[0]) and "\n" not in msg
    assert f"this is {version}:" in msg


def test_fsdp_import_is_the_one_this_torch_has():
    if not HAS_FSDP2:
        with pytest.raises(ConfigError, match=FSDP_LINE):
            compat.fully_shard()
        return
    fully_shard = compat.fully_shard()
    want = "torch.distributed.fsdp" if compat.version_tuple() >= (2, 6) else "torch.distributed._composable.fsdp"
    assert fully_shard.__module__.startswith(want)


def test_fsdp_refused_before_anything_starts(digits_root, tmp_path, monkeypatch):
    """The gate in hpctrain.train.entry.run, on any torch: with 2.2's version string no run
    directory, process group or loader is made."""
    from hpctrain.train import entry

    monkeypatch.setattr(torch, "__version__", "2.2.2+cu121")
    cfg = load(DIGITS, [f"data.root={digits_root}", f"run.dir={tmp_path}", "run.name=r", "dist.parallel=fsdp"])
    with pytest.raises(ConfigError, match=FSDP_LINE):
        entry.run(cfg, stop=SimpleNamespace(log_new=lambda: None))
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("version", "device", "refused"),
    [
        ("2.2.0a0+81ea7a4", "cuda", "needs torch >= 2.4"),
        ("2.5.1+cu124", "cuda", None),
        ("2.5.1+cu124", "cpu", "on the CPU needs torch >= 2.6"),
        ("2.4.0", "cpu", "on the CPU needs torch >= 2.6"),
        ("2.6.0", "cpu", None),
        ("2.13.0+cpu", "cpu", None),
    ],
)
def test_fsdp_refusal_by_version_and_device(version, device, refused):
    def check():
        compat.check_parallel("fsdp", version)
        compat.check_fsdp_device("fsdp", torch.device(device), version)

    if refused is None:
        check()
    else:
        with pytest.raises(ConfigError, match=refused) as e:
            check()
        assert FSDP_LINE.search(str(e.value)) and f"this is {version}:" in str(e.value)
    compat.check_fsdp_device("ddp", torch.device("cpu"), "2.5.1")  # DDP: never refused


@pytest.mark.skipif(
    HAS_CPU_FSDP,
    reason=f"torch {torch.__version__} has FSDP2 on the CPU: tests/train/test_fsdp.py "
    "trains with it (the refusal runs in the 2.2 and 2.5 stack passes)",
)
def test_fsdp_on_this_torch_fails_in_one_line(digits_root, tmp_path):
    """2 ranks as torchrun starts them: both exit 2 with the one line, without waiting for each
    other at the rendezvous, and leave no run directory."""
    port = free_port()  # (torch 2.2: no FSDP2; 2.4, 2.5: none on the CPU, the pytorch-cuda stack pass)
    procs = [
        subprocess.Popen(
            [sys.executable, *digits_args(digits_root, tmp_path, "r", "dist.parallel=fsdp")],
            env={
                **os.environ,
                "RANK": str(r),
                "WORLD_SIZE": "2",
                "LOCAL_RANK": str(r),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 2, out + err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("hpctrain: error: "), err
        assert FSDP_LINE.search(lines[0]) and f"this is {torch.__version__}:" in lines[0]
    assert not (tmp_path / "r").exists()


def _fp16_trainer(*sets: str) -> Trainer:
    cfg = load(
        DIGITS,
        [
            "data.loader=synthetic",
            "optim.warmup_steps=0",
            "optim.lr=1e-3",
            "train.threads=0",
            "train.amp=fp16",
            "model.depth=1",
            *sets,
        ],
    )
    torch.manual_seed(0)
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
    return build_trainer(cfg, DistInfo(), torch.device("cpu"), None, loader, None, build_vit(cfg.model))


def test_fp16_trains_and_its_scaler_checkpoints(tmp_path):
    """train.amp=fp16 on CPU: with torch >= 2.3 it trains (GradScaler, clipping through unscale_)
    and the scaler's state survives a weights_only checkpoint; 2.2 has no CPU loss scaler and
    refuses in one line rather than train fp16 unscaled."""
    if not hasattr(torch.amp, "GradScaler"):
        with pytest.raises(ConfigError, match=r"train\.amp=fp16 on cpu needs torch >= 2\.3 .*: use train\.amp=bf16"):
            _fp16_trainer()
        return
    tr = _fp16_trainer("optim.clip_grad=1.0")
    batch = next(iter(tr.train_loader))
    losses = []
    for _ in range(3):
        torch.manual_seed(step_seed(0, tr.step, 0))
        losses.append(float(tr.train_step([batch])))
        tr.step += 1
    assert all(map(torch.isfinite, torch.tensor(losses))) and losses[-1] < losses[0]
    path = ckpt.save(tmp_path, tr.step, tr.state(), keep=1)
    st = ckpt.load(path)
    assert st["scaler"] == tr.scaler.state_dict() and st["scaler"]["scale"] > 0
    again = _fp16_trainer("optim.clip_grad=1.0")
    again.load_state(st, path)
    assert again.scaler.state_dict() == tr.scaler.state_dict() and again.step == 3


def test_grad_total_norm_is_clip_grad_norms_and_leaves_the_gradients():
    """The gradient norm logged with clipping off: the value clip_grad_norm_ returns, computed
    without writing to a gradient (same storage, same bits), so the trajectory cannot change."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    model(torch.randn(4, 8)).square().sum().backward()
    grads = [p.grad for p in model.parameters()]
    before = [(g.data_ptr(), g.clone()) for g in grads]
    norm = compat.grad_total_norm(model.parameters())
    assert [p.grad.data_ptr() for p in model.parameters()] == [ptr for ptr, _ in before]
    assert all(torch.equal(g, old) for g, (_, old) in zip(grads, before, strict=True))
    want = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
    assert norm.shape == () and torch.equal(norm, want)


def test_grad_scaler_without_torch_amp_scaler(monkeypatch):
    """What torch 2.2 gets (no torch.amp.GradScaler): the CUDA scaler on CUDA, a one-line refusal
    elsewhere."""
    import warnings

    monkeypatch.delattr(torch.amp, "GradScaler", raising=False)
    with pytest.raises(ConfigError, match="train.amp=fp16 on cpu needs torch >= 2.3"):
        compat.grad_scaler(torch.device("cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no CUDA here (it disables itself); newer torch deprecates it
        assert isinstance(compat.grad_scaler(torch.device("cuda")), torch.cuda.amp.GradScaler)


def test_check_train_refuses_what_torch_2_2_lacks(monkeypatch):
    """The early gate (hpctrain.train.entry.run, before the rendezvous), with 2.2's API surface."""
    monkeypatch.setattr(torch, "__version__", "2.2.2+cu121")
    monkeypatch.delattr(torch.amp, "GradScaler", raising=False)
    monkeypatch.delattr(torch.backends.cuda, "enable_cudnn_sdp", raising=False)
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    ok = load(DIGITS)  # bf16, ddp, sdpa auto: the defaults run on 2.2
    compat.check_train(ok, cpu)
    compat.check_train(ok, cuda)
    cases = [
        ("dist.parallel=fsdp", cuda, FSDP_LINE.pattern),
        ("train.amp=fp16", cpu, r"train\.amp=fp16 on cpu needs torch >= 2\.3 .*this is 2\.2\.2\+cu121"),
        (
            "train.sdpa_backend=cudnn train.amp=bf16",
            cuda,
            r"train\.sdpa_backend=cudnn needs torch >= 2\.3; this is 2\.2\.2",
        ),
    ]
    for setting, device, msg in cases:
        with pytest.raises(ConfigError, match=msg):
            compat.check_train(load(DIGITS, setting.split()), device)
    for setting, what in [
        ("ckpt.format=sharded", "ckpt.format=sharded"),
        ("ckpt.async_save=true", "ckpt.async_save=true"),
    ]:
        with pytest.raises(
            ConfigError,
            match=rf"{re.escape(what)} needs torch >= 2\.4 .*this is 2\.2\.2\+cu121: "
            r"use ckpt\.format=single",
        ):
            compat.check_train(load(DIGITS, [setting]), cpu)
    compat.check_train(load(DIGITS, ["train.amp=fp16"]), cuda)  # CUDA has its scaler on 2.2
    cudnn = load(DIGITS, ["train.sdpa_backend=cudnn", "train.amp=bf16"])
    compat.check_train(cudnn, cpu)  # the switch is CUDA-only


@pytest.mark.parametrize(
    "version, world, fmt, want",
    [
        ("2.13.0+cpu", 1, "auto", "single"),  # one process: one file
        ("2.13.0+cpu", 2, "auto", "sharded"),  # several ranks: each writes and reads its part
        ("2.4.0", 16, "single", "single"),
        ("2.2.2", 2, "auto", "single"),  # 2.2: single files whatever the world size
        ("2.3.1", 8, "auto", "single"),
    ],
)
def test_checkpoint_format_by_world_size_and_torch(version, world, fmt, want):
    assert compat.ckpt_format(load(DIGITS, [f"ckpt.format={fmt}"]).ckpt, world, version) == want


def test_async_save_is_sharded():
    both = load(DIGITS, ["ckpt.async_save=true"]).ckpt
    assert compat.ckpt_format(both, 1, "2.13.0") == "sharded"
    with pytest.raises(ConfigError, match=r"ckpt\.async_save=true writes sharded checkpoints"):
        compat.ckpt_format(load(DIGITS, ["ckpt.async_save=true", "ckpt.format=single"]).ckpt, 4, "2.13.0")


def test_sharded_checkpoint_on_old_torch_is_refused_not_skipped(tmp_path, monkeypatch):
    """--resume auto must not fall back past a sharded checkpoint that this torch cannot read."""
    d = ckpt.ckpt_dir(tmp_path) / ckpt.name(5, "sharded")
    d.mkdir(parents=True)
    (d / ".metadata").write_bytes(b"")
    monkeypatch.setattr(torch, "__version__", "2.2.2+cu121")
    with pytest.raises(ConfigError, match=r"step-00000005 is sharded .*needs torch >= 2\.4; this is 2\.2\.2"):
        ckpt.find_resume(tmp_path, "auto")


def _fake_backends(cudnn: bool) -> SimpleNamespace:
    flags: dict[str, bool] = {}
    names = ["flash", "mem_efficient", "math"] + (["cudnn"] if cudnn else [])
    ns = SimpleNamespace(flags=flags, **{f"enable_{n}_sdp": (lambda v, n=n: flags.__setitem__(n, v)) for n in names})
    return ns


@pytest.mark.parametrize("want", ["flash", "efficient", "math", "cudnn"])
def test_sdpa_backend_switch_on_each_api(want):
    new, old = _fake_backends(cudnn=True), _fake_backends(cudnn=False)
    compat.set_sdpa_backend(want, new)
    assert [n for n, on in new.flags.items() if on] == [{"efficient": "mem_efficient"}.get(want, want)]
    if want == "cudnn":
        with pytest.raises(ConfigError, match="train.sdpa_backend=cudnn needs torch >= 2.3"):
            compat.set_sdpa_backend(want, old)
    else:
        compat.set_sdpa_backend(want, old)
        assert [n for n, on in old.flags.items() if on] == [{"efficient": "mem_efficient"}.get(want, want)]


def test_sdpa_backend_switch_on_this_torch():
    """The real torch.backends.cuda switches exist under these names (global flags; a CPU build
    has them too); restored afterwards."""
    b = torch.backends.cuda
    names = ["flash", "mem_efficient", "math"] + (["cudnn"] if hasattr(b, "enable_cudnn_sdp") else [])
    before = {n: getattr(b, f"{n}_sdp_enabled")() for n in names}
    try:
        compat.set_sdpa_backend("math")
        assert {n: getattr(b, f"{n}_sdp_enabled")() for n in names} == {n: n == "math" for n in names}
    finally:
        for n, on in before.items():
            getattr(b, f"enable_{n}_sdp")(on)


def test_tested_torch_is_the_ngc_image_torch():
    label = re.search(r"pytorch\.version (\d+)\.(\d+)", (Path(ROOT) / "recipes" / "ngc-pytorch-23.12.def").read_text())
    assert label and tuple(map(int, label.groups())) == compat.MIN_TORCH


def test_bf16_gradient_reduction_needs_nccl_2_10_on_cuda(monkeypatch):
    """NCCL all-reduces bf16 from 2.10; gloo (CPU) always does, so only CUDA is gated."""
    bf16 = load(DIGITS, ["dist.grad_reduce_dtype=bf16"])
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 9, 9))
    with pytest.raises(ConfigError, match=r"grad_reduce_dtype=bf16 needs NCCL >= 2\.10.*NCCL 2\.9\.9"):
        compat.check_train(bf16, torch.device("cuda", 0))
    compat.check_train(bf16, torch.device("cpu"))
    compat.check_train(load(DIGITS), torch.device("cuda", 0))  # fp32 reduction: any NCCL
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 10, 3))
    compat.check_train(bf16, torch.device("cuda", 0))

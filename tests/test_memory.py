"""The torch-free memory estimate against the real model: its parameter count against
`models.vit.ViT`, and its activation count against the tensors autograd saves for the backward pass
(counted on CPU with saved_tensors_hooks, as the difference between two batch sizes)."""

from __future__ import annotations

import pytest
import torch

from hpctrain import memory
from hpctrain.config import load
from hpctrain.models.vit import build_vit
from hpctrain.train.optim.build import build_optimizer
from tests.helpers import DIGITS


@pytest.mark.slow
@pytest.mark.parametrize(
    "config, sets",
    [
        ("configs/vit_b16_imagenet_4k.yaml", []),  # ViT-B/16: 86.6 M (timm's vit_base_patch16_224)
        ("configs/vit_s16_imagenet_90ep.yaml", []),  # average pool, fixed sin-cos position embedding
        (DIGITS, ["model.pool=token", "model.mlp_ratio=3.0", "model.patch_size=4"]),
    ],
)
def test_parameter_count_is_the_models(config, sets):
    cfg = load(config, sets)
    model = build_vit(cfg.model)
    pc = memory.param_count(cfg.model)
    assert pc.trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert pc.frozen == sum(p.numel() for p in model.parameters() if not p.requires_grad)
    assert pc.largest_block == sum(p.numel() for p in model.blocks[0].parameters())
    linear = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
    assert pc.matmul == sum(p.numel() for m in linear for p in m.parameters())


def saved_bytes(model: torch.nn.Module, batch: int, amp: str, img: int) -> int:
    """Bytes of the distinct storages autograd saves in one forward pass and the loss (parameters
    excluded: they do not grow with the batch)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    x = torch.randn(batch, 3, img, img)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp == "bf16"):
            logits = model(x)
        torch.nn.functional.log_softmax(logits.float(), dim=-1).mean()
    return sum(seen.values())


@pytest.mark.parametrize(
    "sets",
    [
        ["model.pool=token", "train.amp=none"],
        ["model.pool=avg", "train.amp=none"],
        ["model.pool=token", "train.amp=bf16"],
        ["model.pool=avg", "model.pos_embed=learn", "train.amp=bf16", "model.mlp_ratio=4.0"],
        ["model.pool=token", "train.amp=bf16", "model.drop_rate=0.1"],  # + a bool mask per dropout
        ["model.pool=token", "train.amp=none", "model.drop_rate=0.1"],
    ],
)
def test_activations_per_image_match_what_autograd_saves(sets):
    cfg = load(DIGITS, sets)
    torch.manual_seed(0)
    model = build_vit(cfg.model).train()
    per_image = (
        saved_bytes(model, 12, cfg.train.amp, cfg.model.img_size)
        - saved_bytes(model, 4, cfg.train.amp, cfg.model.img_size)
    ) / 8
    estimate = memory.activation_bytes_per_image(cfg.model, cfg.train.amp)
    assert estimate == pytest.approx(per_image, rel=0.02)


def test_grad_ckpt_keeps_block_inputs_and_one_block():
    """Checkpointed blocks save only their input in the forward pass; the estimate adds the one block
    that the backward pass recomputes at a time."""
    cfg = load(DIGITS, ["model.grad_ckpt=true", "train.amp=bf16"])
    model = build_vit(cfg.model).train()
    per_image = (saved_bytes(model, 12, "bf16", 32) - saved_bytes(model, 4, "bf16", 32)) / 8
    estimate = memory.activation_bytes_per_image(cfg.model, "bf16")
    block = memory.block_activation_bytes(cfg.model, "bf16")
    assert estimate - block == pytest.approx(per_image, rel=0.02)
    assert estimate < memory.activation_bytes_per_image(load(DIGITS, ["train.amp=bf16"]).model, "bf16")


def test_estimate_parts_follow_the_settings():
    cfg = load("configs/vit_b16_imagenet_4k.yaml")
    pc = memory.param_count(cfg.model)
    est = memory.estimate(cfg, 32)
    assert (est.weights, est.grads, est.optimizer, est.ema) == (4 * pc.trainable, 4 * pc.trainable, 8 * pc.trainable, 0)
    assert est.amp_weights == 2 * pc.matmul and est.activations == 32 * est.activations_per_image
    assert est.total == sum(
        v
        for k, v in est.parts().items()
        if k in ("weights", "grads", "optimizer", "ema", "amp_weights", "fsdp_gathered", "activations", "overhead")
    )
    with_ema = memory.estimate(load("configs/vit_b16_imagenet_4k.yaml", ["train.ema=0.9999"]), 32)
    assert with_ema.ema == 4 * pc.trainable
    fp32 = memory.estimate(load("configs/vit_b16_imagenet_4k.yaml", ["train.amp=none"]), 32)
    assert fp32.amp_weights == 0 and fp32.activations_per_image > 1.5 * est.activations_per_image
    fsdp = memory.estimate(load("configs/vit_b16_imagenet_4k.yaml", ["dist.parallel=fsdp"]), 32, world_size=8)
    assert fsdp.optimizer == est.optimizer // 8 and fsdp.fsdp_gathered == 2 * 4 * pc.largest_block
    # max_batch is the boundary of total <= capacity
    cap = int(80 * memory.GB)
    fit = est.max_batch(cap)
    assert memory.estimate(cfg, fit).total <= cap < memory.estimate(cfg, fit + 1).total


@pytest.mark.parametrize(
    "sets",
    [[], ["optim.mu_dtype=bf16"], ["optim.name=lamb"], ["optim.name=sgd"], ["optim.name=sgd", "optim.momentum=0"]],
)
def test_optimizer_state_and_checkpoint_bytes_are_what_the_optimizer_keeps(sets):
    """One rule, used by the memory plan and by the checkpoint-time checks of submit and plan: the
    bytes of the state tensors the real optimizer holds after a step, and of a checkpoint's tensors."""
    cfg = load(str(DIGITS), ["train.ema=0.99", *sets])
    model = build_vit(cfg.model)
    opt = build_optimizer(cfg, model, torch.device("cpu"))
    model(torch.randn(2, 3, cfg.model.img_size, cfg.model.img_size)).sum().backward()
    opt.step()
    state = sum(
        t.numel() * t.element_size()
        for s in opt.state.values()
        for t in s.values()
        if torch.is_tensor(t) and t.dim() > 0
    )  # not the 0-d step counters
    pc = memory.param_count(cfg.model)
    assert state == memory.optimizer_bytes_per_param(cfg.optim) * pc.trainable
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert memory.checkpoint_bytes(cfg) == 2 * weights + state  # weights, EMA copy, optimizer state


def test_fit_accum_keeps_the_global_batch_and_raises_accumulation_only_where_memory_needs_it():
    """A node range on fewer GPUs (docs/launch.md): the 4k recipe's 32 images per GPU on 16 nodes of 8
    fit an 80 GB GPU, and so do 128 on 4 nodes; on 4 GPUs, 1024 per GPU do not, and the fewest
    accumulation steps that divide 4096 and fit are taken; a GPU that holds the bigger batch keeps
    the config's own."""
    cfg = load("configs/vit_b16_imagenet_4k.yaml")
    gb80 = int(80e9)
    assert memory.fit_accum(cfg, 128, gb80) == memory.fit_accum(cfg, 32, gb80) == cfg.train.accum_steps == 1
    acc = memory.fit_accum(cfg, 4, gb80)
    assert acc > 1 and 4096 % acc == 0
    assert memory.estimate(cfg, 4096 // (acc * 4), 4).total <= gb80 < memory.estimate(cfg, 1024, 4).total
    fewer = [a for a in range(1, acc) if 4096 % a == 0]
    assert all(memory.estimate(cfg, -(-4096 // (a * 4)), 4).total > gb80 for a in fewer)
    assert memory.fit_accum(cfg, 4, int(1e15)) == 1
    assert memory.fit_accum(cfg, 4, 1) == 1  # nothing fits: the config's own (the run fails as it would)

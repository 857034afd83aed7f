"""Layer-wise lr decay (MAE's param_groups_lrd) and the head multiplier give each parameter the
expected learning rate; weight-decay exclusions are unchanged; the loop applies the scales."""

from __future__ import annotations

import pytest
import torch

from hpctrain.config import load
from hpctrain.models.vit import ViT
from hpctrain.train.optim.build import param_groups
from tests.helpers import DIGITS


def tiny(depth: int = 3) -> ViT:
    return ViT(img_size=16, patch_size=8, depth=depth, width=32, heads=2, num_classes=5)


def scales(groups: list[dict], model: torch.nn.Module) -> dict[str, tuple[float, float]]:
    """parameter name → (lr scale, weight decay)."""
    name = {id(p): n for n, p in model.named_parameters()}
    return {name[id(p)]: (g.get("lr_scale", 1.0), g["weight_decay"]) for g in groups for p in g["params"]}


def test_layer_decay_scales_each_layer():
    model = tiny(depth=3)
    got = scales(param_groups(model, 0.05, layer_decay=0.5, head_lr_mult=10.0), model)
    assert set(got) == {n for n, _ in model.named_parameters()}  # every parameter, once
    # MAE: layer id 0 = patch/position embedding and class token, block i = i + 1, after them depth + 1;
    # scale = decay^(depth + 1 - id): 0.5^4 for the embeddings, 0.5^(3 - i) for block i
    assert got["patch_embed.proj.weight"] == (0.5**4, 0.05)
    assert got["patch_embed.proj.bias"] == (0.5**4, 0.0)
    assert got["pos_embed"] == (0.5**4, 0.0) and got["cls_token"] == (0.5**4, 0.0)  # no_weight_decay()
    for i in range(3):
        assert got[f"blocks.{i}.attn.qkv.weight"] == (0.5 ** (3 - i), 0.05)
        assert got[f"blocks.{i}.norm1.weight"] == (0.5 ** (3 - i), 0.0)
        assert got[f"blocks.{i}.mlp.fc2.bias"] == (0.5 ** (3 - i), 0.0)
    assert got["norm.weight"] == (1.0, 0.0)
    assert got["head.weight"] == (10.0, 0.05) and got["head.bias"] == (10.0, 0.0)


def test_without_layer_decay_two_groups_as_before():
    model = tiny()
    groups = param_groups(model, 0.05)
    assert [g["weight_decay"] for g in groups] == [0.05, 0.0] and all("lr_scale" not in g for g in groups)
    decayed = scales(groups, model)
    assert {n for n, (_, wd) in decayed.items() if wd} == {
        n for n, p in model.named_parameters() if p.ndim > 1 and n not in ("pos_embed", "cls_token")
    }


@pytest.mark.parametrize("name", ["adamw", "sgd", "lamb"])
def test_loop_sets_scaled_lrs(name, digits_root, tmp_path):
    """One real training step on digits: each group trains at schedule lr × its scale."""
    from hpctrain.data.build import build_loaders
    from hpctrain.models.vit import build_vit
    from hpctrain.train.dist import DistInfo
    from hpctrain.train.loop import build_trainer

    cfg = load(
        DIGITS,
        [
            f"data.root={digits_root}",
            f"optim.name={name}",
            "optim.layer_decay=0.75",
            "optim.head_lr_mult=3",
            "optim.warmup_epochs=0",
            "train.max_steps=1",
            "data.global_batch=16",
        ],
    )
    dev = torch.device("cpu")
    train, _ = build_loaders(cfg, 0, 1, dev)
    model = build_vit(cfg.model)
    trainer = build_trainer(cfg, DistInfo(), dev, None, train, None, model)
    if name == "sgd":
        assert isinstance(trainer.optimizer, torch.optim.SGD)
        assert trainer.optimizer.defaults["momentum"] == cfg.optim.momentum
    trainer.train_step([next(iter(train))])
    depth = len(model.blocks)
    want = {0: 0.75 ** (depth + 1), depth + 1: 1.0}
    lr = trainer.lr_of(0)
    for g in trainer.optimizer.param_groups:
        assert g["lr"] == pytest.approx(lr * g["lr_scale"], rel=1e-12)
    got = scales(trainer.optimizer.param_groups, model)
    assert got["patch_embed.proj.weight"][0] == pytest.approx(want[0])
    assert got["blocks.0.attn.qkv.weight"][0] == pytest.approx(0.75**depth)
    assert got["head.weight"][0] == pytest.approx(3.0)

"""The ViT matches timm's vit_*_patch16_224 parameter names and shapes, key for key."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hpctrain.config import load
from hpctrain.models import vit as vitmod
from hpctrain.models.vit import ViT, build_vit

# timm.create_model("vit_base_patch16_224").state_dict(): name → shape, in timm's order.
TIMM_VIT_B16_HEAD = [
    ("cls_token", (1, 1, 768)),
    ("pos_embed", (1, 197, 768)),
    ("patch_embed.proj.weight", (768, 3, 16, 16)),
    ("patch_embed.proj.bias", (768,)),
]
TIMM_VIT_B16_BLOCK = [  # blocks.<i>. for i in 0..11
    ("norm1.weight", (768,)),
    ("norm1.bias", (768,)),
    ("attn.qkv.weight", (2304, 768)),
    ("attn.qkv.bias", (2304,)),
    ("attn.proj.weight", (768, 768)),
    ("attn.proj.bias", (768,)),
    ("norm2.weight", (768,)),
    ("norm2.bias", (768,)),
    ("mlp.fc1.weight", (3072, 768)),
    ("mlp.fc1.bias", (3072,)),
    ("mlp.fc2.weight", (768, 3072)),
    ("mlp.fc2.bias", (768,)),
]
TIMM_VIT_B16_TAIL = [
    ("norm.weight", (768,)),
    ("norm.bias", (768,)),
    ("head.weight", (1000, 768)),
    ("head.bias", (1000,)),
]
TIMM_VIT_B16 = (TIMM_VIT_B16_HEAD
                + [(f"blocks.{i}.{k}", s) for i in range(12) for k, s in TIMM_VIT_B16_BLOCK]
                + TIMM_VIT_B16_TAIL)


@pytest.fixture(scope="module")
def vit_b16():
    return build_vit(load("configs/vit_b16_imagenet.yaml").model)


def test_vit_b16_state_dict_equals_timm(vit_b16):
    got = [(k, tuple(v.shape)) for k, v in vit_b16.state_dict().items()]
    assert got == TIMM_VIT_B16
    assert len(got) == 152


def test_vit_b16_has_86_6m_parameters(vit_b16):
    assert sum(p.numel() for p in vit_b16.parameters()) == 86_567_656


def test_timm_state_dict_loads_strictly(vit_b16):
    timm_like = {k: torch.randn(s) for k, s in TIMM_VIT_B16}
    vit_b16.load_state_dict(timm_like, strict=True)
    assert torch.equal(vit_b16.head.bias, timm_like["head.bias"])


@pytest.mark.parametrize("arch, params", [("vit_tiny", 5_717_416), ("vit_small", 22_050_664),
                                          ("vit_large", 304_326_632)])
def test_sizes_match_timm_parameter_counts(arch, params):
    m = ViT(**dict(zip(("depth", "width", "heads"), vitmod.ARCHS[arch])))
    assert sum(p.numel() for p in m.parameters()) == params


def test_gap_sincos_variant_uses_timm_names():
    m = ViT(img_size=32, patch_size=8, depth=2, width=64, heads=2, pool="avg", pos_embed="sincos",
            num_classes=10)
    keys = list(m.state_dict())
    assert "cls_token" not in keys and "fc_norm.weight" in keys and "norm.weight" not in keys
    assert m.state_dict()["pos_embed"].shape == (1, 16, 64)
    assert not m.pos_embed.requires_grad  # fixed sin-cos
    assert m(torch.randn(3, 3, 32, 32)).shape == (3, 10)


def test_attention_goes_through_sdpa(monkeypatch):
    calls = []
    real = F.scaled_dot_product_attention

    def spy(*a, **k):
        calls.append(a[0].shape)
        return real(*a, **k)

    monkeypatch.setattr(vitmod.F, "scaled_dot_product_attention", spy)
    m = ViT(img_size=32, patch_size=8, depth=3, width=64, heads=4, num_classes=5)
    m(torch.randn(2, 3, 32, 32))
    assert calls == [torch.Size([2, 4, 17, 16])] * 3  # B, heads, 1+16 tokens, head dim


def test_drop_path_only_in_training():
    torch.manual_seed(0)
    m = ViT(img_size=32, patch_size=8, depth=2, width=64, heads=2, num_classes=5, drop_path=0.5)
    x = torch.randn(4, 3, 32, 32)
    m.eval()
    assert torch.equal(m.forward_features(x), m.forward_features(x))
    m.train()
    assert not torch.equal(m.forward_features(x), m.forward_features(x))


def test_grad_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    a = ViT(img_size=32, patch_size=8, depth=2, width=64, heads=2, num_classes=5)
    b = ViT(img_size=32, patch_size=8, depth=2, width=64, heads=2, num_classes=5, grad_ckpt=True)
    b.load_state_dict(a.state_dict())
    x = torch.randn(4, 3, 32, 32)
    a(x).sum().backward()
    b(x).sum().backward()
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-6), n

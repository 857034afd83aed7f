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
TIMM_VIT_B16 = (
    TIMM_VIT_B16_HEAD + [(f"blocks.{i}.{k}", s) for i in range(12) for k, s in TIMM_VIT_B16_BLOCK] + TIMM_VIT_B16_TAIL
)


@pytest.fixture(scope="module")
def vit_b16():
    return build_vit(load("configs/vit_b16_imagenet.yaml").model)


@pytest.mark.slow
def test_vit_b16_state_dict_equals_timm(vit_b16):
    got = [(k, tuple(v.shape)) for k, v in vit_b16.state_dict().items()]
    assert got == TIMM_VIT_B16
    assert len(got) == 152


def test_vit_b16_has_86_6m_parameters(vit_b16):
    assert sum(p.numel() for p in vit_b16.parameters()) == 86_567_656


@pytest.mark.slow
def test_timm_state_dict_loads_strictly(vit_b16):
    timm_like = {k: torch.randn(s) for k, s in TIMM_VIT_B16}
    vit_b16.load_state_dict(timm_like, strict=True)
    assert torch.equal(vit_b16.head.bias, timm_like["head.bias"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch, params", [("vit_tiny", 5_717_416), ("vit_small", 22_050_664), ("vit_large", 304_326_632)]
)
def test_sizes_match_timm_parameter_counts(arch, params):
    m = ViT(**dict(zip(("depth", "width", "heads"), vitmod.ARCHS[arch])))
    assert sum(p.numel() for p in m.parameters()) == params


def test_gap_sincos_variant_uses_timm_names():
    m = ViT(img_size=32, patch_size=8, depth=2, width=64, heads=2, pool="avg", pos_embed="sincos", num_classes=10)
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


# ----------------------------------------------------------------- big_vision options (docs/recipes.md)


def _tiny(**kw) -> ViT:
    return ViT(
        img_size=32, patch_size=8, depth=2, width=64, heads=2, pool="avg", pos_embed="sincos", num_classes=10, **kw
    )


def test_pre_logits_is_a_named_dense_tanh_before_the_head():
    torch.manual_seed(0)
    m = _tiny(rep_size=48)
    sd = m.state_dict()
    assert sd["pre_logits.fc.weight"].shape == (48, 64) and sd["pre_logits.fc.bias"].shape == (48,)
    assert sd["head.weight"].shape == (10, 48)
    x = torch.randn(5, 3, 32, 32)
    with torch.no_grad():
        m.pre_logits.fc.weight.mul_(100)  # pre-activations far beyond ±1: tanh must bound them
    feats = m.pre_logits(m.forward_features(x))
    assert feats.shape == (5, 48)
    assert feats.abs().max() <= 1.0 and feats.abs().max() > 0.99
    with torch.no_grad():
        m.head.weight.normal_()
        m.head.bias.normal_()
    torch.testing.assert_close(m(x), m.head(torch.tanh(m.pre_logits.fc(m.forward_features(x)))))


def test_pre_logits_off_keeps_timm_keys_and_counts():
    plain = [k for k in _tiny().state_dict()]
    assert not any(k.startswith("pre_logits") for k in plain)
    rep = _tiny(rep_size=64)
    assert [k for k in rep.state_dict() if not k.startswith("pre_logits")] == plain


def test_zero_head_gives_zero_logits_at_init_and_trunc_normal_does_not():
    x = torch.randn(4, 3, 32, 32)
    for kw in ({}, {"rep_size": 64}):
        assert torch.equal(_tiny(head_init="zero", **kw)(x), torch.zeros(4, 10))
    torch.manual_seed(0)
    m = _tiny(head_init="trunc_normal")
    assert m(x).abs().max() > 0 and 0.01 < m.head.weight.std() < 0.03
    assert torch.equal(m.head.bias, torch.zeros(10))


def _layer_norm(x, w, b, eps=1e-6):  # written out, not nn.LayerNorm: the reference must not share code
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def _tiny_final_norm(final_norm: str, pool: str = "avg") -> ViT:
    """_tiny's model through the config: model.final_norm as a user sets it."""
    sets = ["img_size=32", "patch_size=8", "depth=2", "width=64", "heads=2", "pos_embed=sincos", "num_classes=10"]
    return build_vit(load(None, [f"model.{s}" for s in [*sets, f"pool={pool}", f"final_norm={final_norm}"]]).model)


@pytest.mark.parametrize("order", ["before", "after"])
def test_final_norm_place_equals_a_direct_reimplementation(order):
    torch.manual_seed(0)
    m = _tiny_final_norm("tokens" if order == "before" else "pooled")
    norm = m.norm if order == "before" else m.fc_norm
    with torch.no_grad():  # non-trivial affine so the two orders differ
        norm.weight.normal_()
        norm.bias.normal_()
    x = torch.randn(3, 3, 32, 32)
    tokens = m.blocks(m.patch_embed(x) + m.pos_embed)
    w, b = norm.weight, norm.bias
    if order == "before":  # big_vision: Encoder's encoder_norm on every token, then jnp.mean(x, axis=1)
        want = _layer_norm(tokens, w, b).mean(dim=1)
    else:  # timm global_pool="avg": mean over tokens, then fc_norm
        want = _layer_norm(tokens.mean(dim=1), w, b)
    got = m.forward_features(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    other = _layer_norm(tokens.mean(dim=1), w, b) if order == "before" else _layer_norm(tokens, w, b).mean(1)
    assert (got - other).abs().max() > 1e-3  # the two orders are not the same function


def test_final_norm_tokens_under_the_average_uses_timm_norm_name():
    keys = list(_tiny_final_norm("tokens").state_dict())
    assert "norm.weight" in keys and "fc_norm.weight" not in keys  # timm: global_pool="avg", fc_norm=False
    assert list(_tiny_final_norm("auto").state_dict()) == list(_tiny_final_norm("pooled").state_dict())


def test_s16_recipe_builds_big_vision_model_and_counts_match():
    from hpctrain.flops import model_flops
    from hpctrain.memory import param_count

    mc = load("configs/vit_s16_imagenet_90ep.yaml").model
    assert (mc.rep_size, mc.head_init, mc.final_norm, mc.init) == (384, "zero", "tokens", "big_vision")
    assert (mc.pool, mc.pos_embed) == ("avg", "sincos_big_vision")
    m = build_vit(mc)
    assert m.blocks[0].mlp.act.approximate == "tanh" and torch.equal(m.patch_embed.proj.bias, torch.zeros(384))
    assert load("configs/vit_b16_imagenet.yaml").model.init == "deit"  # the DeiT recipe
    assert sum(p.numel() for p in m.parameters() if p.requires_grad) == param_count(mc).trainable
    # timm's vit_small (22,050,664) without the class token and its position, plus pre_logits.fc
    assert sum(p.numel() for p in m.parameters()) == 22_050_664 - 384 - 384 + (384 * 384 + 384)
    base = model_flops(load("configs/vit_s16_imagenet_90ep.yaml", ["model.rep_size=0"]).model).fwd_macs
    assert model_flops(mc).fwd_macs - base == 384 * 384


def test_final_norm_under_the_token_pool_names_the_norm_as_timm_does():
    """pool=token: the norm on every token then the class token (auto, tokens: timm's `norm`) equals the
    class token normed (pooled: timm's fc_norm=True with global_pool='token'); only the name differs."""
    torch.manual_seed(0)
    auto, tokens, pooled = (_tiny_final_norm(n, pool="token") for n in ("auto", "tokens", "pooled"))
    assert list(auto.state_dict()) == list(tokens.state_dict()) and "norm.weight" in auto.state_dict()
    assert "fc_norm.weight" in pooled.state_dict() and "norm.weight" not in pooled.state_dict()
    pooled.load_state_dict(
        {k.replace("norm.", "fc_norm.") if k.startswith("norm.") else k: v for k, v in auto.state_dict().items()}
    )
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(pooled.forward_features(x), auto.forward_features(x), rtol=1e-5, atol=1e-5)


def test_big_vision_init_follows_flax_initialisers():
    torch.manual_seed(0)
    d, hidden = 64, 128
    m = ViT(
        img_size=32,
        patch_size=8,
        depth=2,
        width=d,
        heads=2,
        mlp_ratio=2.0,
        pool="avg",
        pos_embed="sincos",
        num_classes=10,
        rep_size=d,
        init="big_vision",
    )
    blk = m.blocks[0]
    for w, fan_in, fan_out in [
        *((q, d, d) for q in blk.attn.qkv.weight.chunk(3)),
        (blk.attn.proj.weight, d, d),
        (blk.mlp.fc1.weight, d, hidden),
        (blk.mlp.fc2.weight, hidden, d),
    ]:
        bound = (6.0 / (fan_in + fan_out)) ** 0.5  # Xavier uniform: U(-bound, bound), std bound/sqrt(3)
        assert w.abs().max() <= bound and w.abs().max() > 0.95 * bound
        assert w.std().item() == pytest.approx(bound / 3**0.5, rel=0.06)
    assert torch.equal(blk.attn.qkv.bias, torch.zeros(3 * d))
    assert 0 < blk.mlp.fc1.bias.abs().max() < 1e-5  # N(0, 1e-6)
    for w, fan_in in [(m.patch_embed.proj.weight, 3 * 8 * 8), (m.pre_logits.fc.weight, d)]:
        std = (1.0 / fan_in) ** 0.5 / 0.87962566103423978  # LeCun normal, truncated at ±2σ
        assert w.abs().max() <= 2 * std and w.std().item() == pytest.approx((1.0 / fan_in) ** 0.5, rel=0.06)
    timm_init = ViT(
        img_size=32,
        patch_size=8,
        depth=2,
        width=d,
        heads=2,
        mlp_ratio=2.0,
        pool="avg",
        pos_embed="sincos",
        num_classes=10,
    )
    assert timm_init.blocks[0].attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_sincos_big_vision_equals_its_posemb_sincos_2d():
    import numpy as np

    grid, width, temp = 4, 32, 10_000.0
    y, x = np.mgrid[:grid, :grid]  # big_vision models/vit.py posemb_sincos_2d, written out in NumPy
    omega = 1.0 / temp ** (np.arange(width // 4) / (width // 4 - 1))
    xo, yo = np.outer(x.flatten(), omega), np.outer(y.flatten(), omega)
    want = np.concatenate([np.sin(xo), np.cos(xo), np.sin(yo), np.cos(yo)], axis=1)[None]
    m = ViT(img_size=32, patch_size=8, depth=1, width=width, heads=2, pool="avg", pos_embed="sincos_big_vision")
    torch.testing.assert_close(m.pos_embed.detach(), torch.from_numpy(want).float(), rtol=1e-5, atol=1e-5)
    plain = ViT(img_size=32, patch_size=8, depth=1, width=width, heads=2, pool="avg", pos_embed="sincos")
    assert (plain.pos_embed - m.pos_embed).abs().max() > 0.1  # the default keeps MoCo v3's frequencies


def test_mae_global_pool_keeps_the_class_token_out_of_the_average_then_fc_norm():
    """pool=avg + class_token + fc_norm is MAE's fine-tuning model (models_vit.py:46-48: the class token
    stays in the sequence, x[:, 1:].mean(dim=1), then fc_norm) with timm's names (class_token=True,
    global_pool='avg', fc_norm=True: cls_token, a 1 + 16 position table, fc_norm, no norm)."""
    torch.manual_seed(0)
    mc = load(
        None,
        [
            "model.img_size=32",
            "model.patch_size=8",
            "model.depth=2",
            "model.width=64",
            "model.heads=2",
            "model.num_classes=10",
            "model.pool=avg",
            "model.class_token=true",
            "model.final_norm=pooled",
        ],
    ).model
    m = build_vit(mc)
    sd = m.state_dict()
    assert sd["cls_token"].shape == (1, 1, 64) and sd["pos_embed"].shape == (1, 17, 64)
    assert "fc_norm.weight" in sd and "norm.weight" not in sd
    with torch.no_grad():  # non-trivial class token and affine, so a wrong pool shows
        m.cls_token.normal_(std=3.0)
        m.fc_norm.weight.normal_()
        m.fc_norm.bias.normal_()
    x = torch.randn(3, 3, 32, 32)
    tokens = torch.cat([m.cls_token.expand(3, -1, -1), m.patch_embed(x)], dim=1) + m.pos_embed
    tokens = m.blocks(tokens)
    want = _layer_norm(tokens[:, 1:].mean(dim=1), m.fc_norm.weight, m.fc_norm.bias)
    got = m.forward_features(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with_cls = _layer_norm(tokens.mean(dim=1), m.fc_norm.weight, m.fc_norm.bias)
    assert (got - with_cls).abs().max() > 1e-3  # the class token is not averaged in
    from hpctrain.flops import model_flops
    from hpctrain.memory import param_count

    assert sum(p.numel() for p in m.parameters()) == param_count(mc).trainable
    assert (
        model_flops(mc).fwd_macs
        > model_flops(
            load(
                None,
                [
                    f"model.{k}={v}"
                    for k, v in (
                        ("img_size", 32),
                        ("patch_size", 8),
                        ("depth", 2),
                        ("width", 64),
                        ("heads", 2),
                        ("num_classes", 10),
                        ("pool", "avg"),
                    )
                ],
            ).model
        ).fwd_macs
    )  # one token more


def test_class_token_and_final_norm_defaults_keep_the_existing_models():
    """null: pool=token → class token and the token norm (timm's default ViT); pool=avg → neither class
    token nor token norm, fc_norm after the average (timm class_token=False, global_pool='avg')."""
    token = build_vit(
        load(
            None, ["model.depth=1", "model.width=64", "model.heads=2", "model.img_size=32", "model.patch_size=8"]
        ).model
    ).state_dict()
    assert "cls_token" in token and "norm.weight" in token and "fc_norm.weight" not in token
    avg = _tiny().state_dict()
    assert "cls_token" not in avg and avg["pos_embed"].shape == (1, 16, 64) and "fc_norm.weight" in avg
    assert "norm.weight" not in avg
    off = _tiny(fc_norm=False).state_dict()  # timm's fc_norm=False is model.final_norm=tokens
    assert list(off) == list(_tiny_final_norm("tokens").state_dict())


def test_class_token_and_final_norm_refuse_what_timm_cannot_build():
    from hpctrain.config import ConfigError

    with pytest.raises(ConfigError, match="model.pool=token reads the class token"):
        load(None, ["model.class_token=false"])
    with pytest.raises(ConfigError, match=r"model.final_norm='middle' .*tokens, pooled"):
        load(None, ["model.final_norm=middle"])


def _init_model(init: str, **kw) -> ViT:
    torch.manual_seed(0)
    sets = [
        "model.img_size=64",
        "model.patch_size=16",
        "model.depth=1",
        "model.width=256",
        "model.heads=4",
        "model.num_classes=10",
        f"model.init={init}",
        *(f"model.{k}={v}" for k, v in kw.items()),
    ]
    return build_vit(load(None, sets).model)


def test_deit_init_draws_class_token_and_position_embedding_trunc_normal_002():
    """timm 0.3.2 (vision_transformer.py:241-242 at 6504a42): trunc_normal_(std=.02) on both; the
    default `timm` init draws the class token N(0, 1e-6)."""
    m = _init_model("deit")
    for t in (m.cls_token, m.pos_embed):
        assert t.std().item() == pytest.approx(0.02, rel=0.12)
    big = ViT(img_size=224, patch_size=16, depth=1, width=768, heads=12, num_classes=10, init="deit")
    assert big.cls_token.std().item() == pytest.approx(0.02, rel=0.1)  # 768 draws
    assert _init_model("timm").cls_token.abs().max() < 1e-5


def test_deit_init_keeps_pytorchs_default_patch_embedding_conv():
    """timm 0.3.2's _init_weights (vision_transformer.py:245-252) touches Linear and LayerNorm only: the
    nn.Conv2d patch embedding keeps kaiming_uniform(a=√5), U(±1/√fan_in) → std 1/√(3·768) ≈ 0.0208 at
    patch 16, and a U(±1/√fan_in) bias; timm's current init is trunc_normal(std=√(1/fan_in)) ≈ 0.036, bias 0."""
    fan_in = 3 * 16 * 16
    bound = fan_in**-0.5
    w, b = (_init_model("deit").patch_embed.proj.weight, _init_model("deit").patch_embed.proj.bias)
    assert w.abs().max() <= bound and w.abs().max() > 0.99 * bound
    assert w.std().item() == pytest.approx(bound / 3**0.5, rel=0.02) == pytest.approx(0.0208, rel=0.02)
    assert b.abs().max() <= bound and b.abs().max() > 0.5 * bound
    timm_w = _init_model("timm").patch_embed.proj.weight
    assert timm_w.std().item() == pytest.approx(bound, rel=0.1)


def test_big_vision_init_zeroes_the_patch_embedding_bias():
    """flax nn.Conv's bias_init defaults to zeros (flax linen/linear.py _Conv), and big_vision's
    "embedding" Conv sets none (models/vit.py:212-214)."""
    assert torch.equal(_init_model("big_vision").patch_embed.proj.bias, torch.zeros(256))
    assert _init_model("timm").patch_embed.proj.bias.abs().max() > 0  # the other inits keep PyTorch's U(±1/√fan_in)


def test_big_vision_gelu_is_the_tanh_approximation():
    """big_vision's MlpBlock calls flax nn.gelu (models/vit.py:75) = jax.nn.gelu(approximate=True):
    x/2 · (1 + tanh(√(2/π)(x + 0.044715 x³))); the timm and DeiT models keep the exact erf GELU."""
    x = torch.linspace(-4, 4, 101)
    jax_tanh = 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x**3)))
    erf = 0.5 * x * (1 + torch.erf(x / 2**0.5))
    act = _init_model("big_vision").blocks[0].mlp.act
    torch.testing.assert_close(act(x), jax_tanh, rtol=1e-6, atol=1e-6)
    assert (act(x) - erf).abs().max() > 1e-4
    for init in ("timm", "deit"):
        torch.testing.assert_close(_init_model(init).blocks[0].mlp.act(x), erf, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(_init_model("big_vision", gelu="exact").blocks[0].mlp.act(x), erf)
    torch.testing.assert_close(_init_model("timm", gelu="tanh").blocks[0].mlp.act(x), jax_tanh, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------- dropout (docs/recipes.md)


def _no_dropout_forward(m: ViT, x: torch.Tensor) -> torch.Tensor:
    """The forward as it was before model.drop_rate existed (no dropout anywhere), written out op by op
    with the model's parameters: the rate-0 model must compute exactly this, bit for bit."""
    t = m.patch_embed.proj(x).flatten(2).transpose(1, 2)
    t = torch.cat([m.cls_token.expand(t.shape[0], -1, -1), t], dim=1) + m.pos_embed
    for blk in m.blocks:
        b, n, d = t.shape
        h = F.layer_norm(t, (d,), blk.norm1.weight, blk.norm1.bias, 1e-6)
        qkv = F.linear(h, blk.attn.qkv.weight, blk.attn.qkv.bias)
        qkv = qkv.reshape(b, n, 3, blk.attn.heads, d // blk.attn.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2]).transpose(1, 2).reshape(b, n, d)
        t = t + F.linear(a, blk.attn.proj.weight, blk.attn.proj.bias)
        h = F.layer_norm(t, (d,), blk.norm2.weight, blk.norm2.bias, 1e-6)
        h = F.gelu(F.linear(h, blk.mlp.fc1.weight, blk.mlp.fc1.bias))
        t = t + F.linear(h, blk.mlp.fc2.weight, blk.mlp.fc2.bias)
    t = F.layer_norm(t, (t.shape[-1],), m.norm.weight, m.norm.bias, 1e-6)
    return F.linear(t[:, 0], m.head.weight, m.head.bias)


def _drop_model(**kw) -> ViT:
    torch.manual_seed(0)
    return ViT(img_size=32, patch_size=8, depth=2, width=64, heads=2, num_classes=5, head_init="trunc_normal", **kw)


def test_drop_rate_zero_is_bit_identical_to_the_model_without_dropout():
    """Defaults (drop_rate = attn_drop_rate = 0): no Dropout module, no random number drawn in a training
    forward, logits equal bit for bit to the dropout-free forward; the init draws are unchanged too."""
    m = _drop_model()
    assert not any(isinstance(mod, torch.nn.Dropout) for mod in m.modules())
    x = torch.randn(4, 3, 32, 32)
    m.train()
    state = torch.get_rng_state()
    got = m(x)
    assert torch.equal(torch.get_rng_state(), state)  # nothing drawn: the seeds' streams are today's
    assert torch.equal(got, _no_dropout_forward(m, x))
    with_drop = _drop_model(drop_rate=0.1, attn_drop_rate=0.1)  # same seed: same weights, dropout adds none
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), with_drop.state_dict().values()))


def test_dropout_is_active_in_training_and_off_in_eval():
    x = torch.randn(4, 3, 32, 32)
    for kw in ({"drop_rate": 0.2}, {"attn_drop_rate": 0.2}):
        m = _drop_model(**kw)
        m.train()
        assert not torch.equal(m(x), m(x)), kw  # a fresh mask per forward
        m.eval()
        assert torch.equal(m(x), m(x)), kw
        assert torch.equal(m(x), _no_dropout_forward(m, x)), kw  # eval: exactly the dropout-free model


def test_drop_rate_places_dropout_as_the_vit_paper():
    """vit_jax models_vit.py: after the position embedding, after the attention output, after both MLP
    Dense layers (dropout_rate); attention probabilities (attention_dropout_rate) through SDPA."""
    m = _drop_model(drop_rate=0.1, attn_drop_rate=0.05)
    drops = sorted(n for n, mod in m.named_modules() if isinstance(mod, torch.nn.Dropout))
    assert drops == sorted(
        ["pos_drop"] + [f"blocks.{i}.{s}" for i in range(2) for s in ("attn.proj_drop", "mlp.drop1", "mlp.drop2")]
    )
    assert all(mod.p == 0.1 for mod in m.modules() if isinstance(mod, torch.nn.Dropout))
    assert [b.attn.attn_drop for b in m.blocks] == [0.05, 0.05]


def test_attention_dropout_reaches_sdpa_only_in_training(monkeypatch):
    seen = []
    real = F.scaled_dot_product_attention

    def spy(*a, **k):
        seen.append(k.get("dropout_p", 0.0))
        return real(*a, **k)

    monkeypatch.setattr(vitmod.F, "scaled_dot_product_attention", spy)
    m = _drop_model(attn_drop_rate=0.3)
    x = torch.randn(2, 3, 32, 32)
    m.train()
    m(x)
    m.eval()
    m(x)
    assert seen == [0.3, 0.3, 0.0, 0.0]


@pytest.mark.slow
def test_timm_weights_load_into_a_model_with_dropout(vit_b16):
    """Dropout has no parameters: timm's state_dict loads strictly into a ViT-B/16 with dropout on."""
    m = ViT(drop_rate=0.1, attn_drop_rate=0.1)
    timm_like = {k: torch.randn(s) for k, s in TIMM_VIT_B16}
    m.load_state_dict(timm_like, strict=True)
    assert [(k, tuple(v.shape)) for k, v in m.state_dict().items()] == [
        (k, tuple(v.shape)) for k, v in vit_b16.state_dict().items()
    ]


def test_drop_rates_from_the_config_and_the_4k_recipe():
    cfg = load("vit_b16_imagenet_4k", ["model.arch=vit_tiny", "model.depth=1"])
    assert (cfg.model.drop_rate, cfg.model.attn_drop_rate) == (0.1, 0.0)  # ViT paper Table 3, appendix B.1
    m = build_vit(cfg.model)
    assert m.pos_drop.p == 0.1 and m.blocks[0].mlp.drop2.p == 0.1 and m.blocks[0].attn.attn_drop == 0.0
    with pytest.raises(ValueError, match="model.drop_rate=1 drops every activation"):
        load(None, ["model.drop_rate=1"])
    with pytest.raises(ValueError, match="did you mean 'model.drop_rate'"):  # vit_jax's and DeiT's names
        load(None, ["model.dropout_rate=0.1"])
    with pytest.raises(ValueError, match="did you mean 'model.drop_rate'"):
        load(None, ["model.drop=0.1"])

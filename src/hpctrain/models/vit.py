"""Vision Transformer whose state_dict matches timm's `vit_*_patch16_224` key for key.

Attention goes through `F.scaled_dot_product_attention` so PyTorch picks the flash / cuDNN /
memory-efficient kernel on GPUs. Keeping timm's parameter names means pretrained weights move
in both directions without a renaming table. big_vision's extras are options with names of their
own, off by default: a pre-logits Dense + tanh (`pre_logits.fc`, timm's old name for it), the final
LayerNorm on every token before the average pool (`norm`, as timm's `fc_norm=False`), the head's
init (docs/recipes.md).

Dropout sits where the ViT paper puts it (vit_jax models_vit.py at c6de1e5: after the position
embedding :195, after the attention output :147, after both MLP Dense layers :91, :99-101) and where
timm 0.3.2's `drop_rate` puts it; `attn_drop` drops attention probabilities (:144, timm attn_drop_rate).
At rate 0 the modules are Identity and SDPA gets dropout_p=0: the rate-0 model draws no random numbers
and computes what it did before the options existed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from hpctrain.models.arch import ARCHS, arch_dims  # noqa: F401  (re-exported: callers import them here)


class DropPath(nn.Module):
    """Stochastic depth: drop a residual branch per sample."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep


def dropout(p: float) -> nn.Module:
    """nn.Dropout(p), or Identity at p = 0 (no RNG draw, no kernel: the defaults path unchanged)."""
    return nn.Dropout(p) if p > 0 else nn.Identity()


class PatchEmbed(nn.Module):
    def __init__(self, img_size: int, patch_size: int, width: int):
        super().__init__()
        if img_size % patch_size:
            raise ValueError(f"model.img_size={img_size} is not a multiple of model.patch_size={patch_size}")
        self.grid = img_size // patch_size
        self.proj = nn.Conv2d(3, width, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # B, N, D


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, attn_drop: float = 0.0, proj_drop: float = 0.0):
        super().__init__()
        if width % heads:
            raise ValueError(f"model width {width} is not divisible by heads {heads}")
        self.heads = heads
        self.attn_drop = attn_drop
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.proj_drop = dropout(proj_drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        # SDPA's dropout_p applies whenever it is > 0, in eval too: only a training forward passes it
        x = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], dropout_p=self.attn_drop if self.training else 0.0)
        return self.proj_drop(self.proj(x.transpose(1, 2).reshape(b, n, d)))


class Mlp(nn.Module):
    def __init__(self, width: int, hidden: int, gelu: str = "exact", drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.act = nn.GELU(approximate="tanh" if gelu == "tanh" else "none")
        self.drop1 = dropout(drop)
        self.fc2 = nn.Linear(hidden, width)
        self.drop2 = dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class Block(nn.Module):
    def __init__(
        self,
        width: int,
        heads: int,
        mlp_ratio: float,
        drop_path: float,
        gelu: str = "exact",
        drop: float = 0.0,
        attn_drop: float = 0.0,
    ):
        super().__init__()
        self.norm1 = nn.LayerNorm(width, eps=1e-6)
        self.attn = Attention(width, heads, attn_drop, drop)
        self.norm2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = Mlp(width, int(width * mlp_ratio), gelu, drop)
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


def sincos_2d(grid: int, width: int, temperature: float = 10000.0, big_vision: bool = False) -> torch.Tensor:
    """Fixed 2-D sin-cos position embedding (MoCo v3), shape 1×grid²×width. Frequencies
    1/T^(i/(D/4)); big_vision's posemb_sincos_2d divides by D/4 - 1 instead, so its lowest is 1/T."""
    if width % 4:
        raise ValueError(f"sin-cos position embedding needs width divisible by 4, got {width}")
    y, x = torch.meshgrid(
        torch.arange(grid, dtype=torch.float32), torch.arange(grid, dtype=torch.float32), indexing="ij"
    )
    q = width // 4
    omega = 1.0 / temperature ** (torch.arange(q, dtype=torch.float32) / (q - 1 if big_vision else q))
    y = y.flatten()[:, None] * omega[None]
    x = x.flatten()[:, None] * omega[None]
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)[None]


class ViT(nn.Module):
    def __init__(
        self,
        img_size: int = 224,
        patch_size: int = 16,
        depth: int = 12,
        width: int = 768,
        heads: int = 12,
        mlp_ratio: float = 4.0,
        num_classes: int = 1000,
        pool: str = "token",
        pos_embed: str = "learn",
        drop_path: float = 0.0,
        grad_ckpt: bool = False,
        rep_size: int = 0,
        head_init: str = "zero",
        init: str = "timm",
        class_token: bool | None = None,
        fc_norm: bool | None = None,
        gelu: str = "exact",
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
    ):
        super().__init__()
        self.pool = pool
        self.head_init = head_init
        self.init = init
        self.grad_ckpt = grad_ckpt
        self.patch_embed = PatchEmbed(img_size, patch_size, width)
        n = self.patch_embed.grid**2
        # timm's class_token / fc_norm defaults: a class token for pool=token only; fc_norm for pool=avg
        self.num_prefix = int(pool == "token" if class_token is None else class_token)
        if self.num_prefix:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        if pos_embed.startswith("sincos"):
            pe = sincos_2d(self.patch_embed.grid, width, big_vision=pos_embed == "sincos_big_vision")
            if self.num_prefix:
                pe = torch.cat([torch.zeros(1, 1, width), pe], dim=1)
            self.pos_embed = nn.Parameter(pe, requires_grad=False)
        else:
            self.pos_embed = nn.Parameter(torch.randn(1, n + self.num_prefix, width) * 0.02)
        self.pos_drop = dropout(drop_rate)
        rates = [drop_path * i / max(depth - 1, 1) for i in range(depth)]
        self.blocks = nn.Sequential(
            *[Block(width, heads, mlp_ratio, r, gelu, drop_rate, attn_drop_rate) for r in rates]
        )
        # timm: final norm before the token pool; fc_norm after the average pool. big_vision
        # (model.final_norm=tokens, fc_norm=False): its encoder_norm on every token, then the average.
        self.norm_first = not (pool == "avg" if fc_norm is None else fc_norm)
        if self.norm_first:
            self.norm = nn.LayerNorm(width, eps=1e-6)
        else:
            self.fc_norm = nn.LayerNorm(width, eps=1e-6)
        if rep_size:  # big_vision rep_size: Dense + tanh between the pooled features and the head
            self.pre_logits = nn.Sequential()
            self.pre_logits.add_module("fc", nn.Linear(width, rep_size))
            self.pre_logits.add_module("act", nn.Tanh())
        else:
            self.pre_logits = nn.Identity()
        self.head = nn.Linear(rep_size or width, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        if self.num_prefix:
            nn.init.normal_(self.cls_token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        if self.init == "deit":
            self._init_deit()
        else:
            w = self.patch_embed.proj.weight
            nn.init.trunc_normal_(w.view(w.shape[0], -1), std=math.sqrt(1.0 / w[0].numel()))
        if self.init == "big_vision":
            self._init_big_vision()
        if self.head_init == "zero":  # big_vision head_zeroinit (bias is zero either way)
            nn.init.zeros_(self.head.weight)

    @torch.no_grad()
    def _init_deit(self) -> None:
        """timm 0.3.2's VisionTransformer, which DeiT builds (vision_transformer.py:241-252 at 6504a42):
        position embedding and class token trunc_normal(std=.02), Linear layers as above; the patch
        embedding is an nn.Conv2d its _init_weights never touches, so it keeps PyTorch's default
        (kaiming_uniform(a=√5): U(±1/√fan_in), std ≈ 0.021 at ViT-B/16; bias U(±1/√fan_in))."""
        if self.num_prefix:
            nn.init.trunc_normal_(self.cls_token, std=0.02)
        if self.pos_embed.requires_grad:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        self.patch_embed.proj.reset_parameters()

    @torch.no_grad()
    def _init_big_vision(self) -> None:
        """big_vision models/vit.py's initialisers (flax/jax semantics): blocks' kernels Xavier-uniform
        (q, k, v each its own d×d kernel in flax's attention), MLP biases N(0, 1e-6), attention biases
        zero; the patch embedding and pre-logits flax's default LeCun normal (truncated at ±2σ, σ
        rescaled by 1/0.8796 for the truncation), its bias zero (flax's default bias_init, models/vit.py:
        212-214); a learned position embedding N(0, 1/width). Its MLP's tanh GELU (nn.gelu, vit.py:75) is
        model.gelu's auto choice (build_vit)."""

        def lecun_normal(w: torch.Tensor, fan_in: int) -> None:
            std = math.sqrt(1.0 / fan_in) / 0.87962566103423978
            nn.init.trunc_normal_(w, std=std, a=-2 * std, b=2 * std)

        for blk in self.blocks:
            for w in blk.attn.qkv.weight.chunk(3, dim=0):
                nn.init.xavier_uniform_(w)
            nn.init.xavier_uniform_(blk.attn.proj.weight)
            for fc in (blk.mlp.fc1, blk.mlp.fc2):
                nn.init.xavier_uniform_(fc.weight)
                nn.init.normal_(fc.bias, std=1e-6)
        w = self.patch_embed.proj.weight
        lecun_normal(w, w[0].numel())
        nn.init.zeros_(self.patch_embed.proj.bias)  # flax nn.Conv's default bias_init: zeros
        if isinstance(self.pre_logits, nn.Sequential):
            lecun_normal(self.pre_logits.fc.weight, self.pre_logits.fc.in_features)
        if self.num_prefix:
            nn.init.zeros_(self.cls_token)
        if self.pos_embed.requires_grad:
            nn.init.normal_(self.pos_embed, std=1.0 / math.sqrt(self.pos_embed.shape[-1]))

    def no_weight_decay(self) -> set[str]:
        return {"pos_embed", "cls_token"}

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        if self.num_prefix:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.pos_drop(x + self.pos_embed)
        for blk in self.blocks:
            if self.grad_ckpt and self.training and torch.is_grad_enabled():
                x = checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        if self.norm_first:
            x = self.norm(x)
        # the average leaves the class token out (timm global_pool='avg'; MAE models_vit.py:47)
        x = x[:, 0] if self.pool == "token" else x[:, self.num_prefix :].mean(dim=1)
        return x if self.norm_first else self.fc_norm(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pre_logits(self.forward_features(x)))


def build_vit(mc) -> ViT:
    """ViT from a `ModelConfig`."""
    depth, width, heads = arch_dims(mc)
    return ViT(
        img_size=mc.img_size,
        patch_size=mc.patch_size,
        depth=depth,
        width=width,
        heads=heads,
        mlp_ratio=mc.mlp_ratio,
        num_classes=mc.num_classes,
        pool=mc.pool,
        pos_embed=mc.pos_embed,
        drop_path=mc.drop_path,
        grad_ckpt=mc.grad_ckpt,
        rep_size=mc.rep_size,
        head_init=mc.head_init,
        init=mc.init,
        class_token=mc.has_class_token,
        fc_norm=mc.has_fc_norm,
        drop_rate=mc.drop_rate,
        attn_drop_rate=mc.attn_drop_rate,
        gelu=("tanh" if mc.init == "big_vision" else "exact") if mc.gelu == "auto" else mc.gelu,
    )

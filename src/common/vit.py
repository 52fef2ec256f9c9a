"""A Vision Transformer (Dosovitskiy et al. 2021) whose attention has separate q, k, v and output projections.

Why our own and not torchvision's `VisionTransformer`: its `nn.MultiheadAttention` packs q, k and v into one
`in_proj_weight` parameter, which tensor parallelism cannot split by heads with `ColwiseParallel` (train_TP.py needs
four `nn.Linear`s per attention and two per MLP). The layout is a flat `nn.Sequential` of named stages, `embed`,
`block0` ... `block{depth-1}`, `head`, so that every script finds the same blocks (FSDP shards them, activation
checkpointing wraps them, model and pipeline parallelism cut between them) and every script starts from the same
initial weights for a seed: `build_model("vit", ...)` is the only place it is built.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F


def vit_config(image_size: int) -> dict:
    """The ViT's shape for S x S images, as keys patch, width, depth, heads, mlp (ints).

    Below 64 px the small ViT: patches of S / 4 px (7 px at 28: 16 patch tokens and the class token), width 128, 4
    blocks of 4 heads, MLP 512 (0.8 M parameters at 28 px). From 64 px ViT-B/16 (Dosovitskiy et al. 2021, table 1):
    16 px patches, width 768, 12 blocks of 12 heads, MLP 3072 (85.8 M parameters at 224 px)."""
    if image_size < 64:
        return {"patch": max(1, image_size // 4), "width": 128, "depth": 4, "heads": 4, "mlp": 512}
    return {"patch": 16, "width": 768, "depth": 12, "heads": 12, "mlp": 3072}


class PatchEmbedding(nn.Module):
    """(N, C, S, S) images -> (N, 1 + (S / patch)^2, width) tokens: each patch projected by a Conv2d of kernel =
    stride = patch, the learned class token in front, the learned position embedding added."""

    def __init__(self, in_channels: int, width: int, patch: int, patches: int):
        super().__init__()
        self.proj = nn.Conv2d(in_channels, width, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + patches, width))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        tokens = self.proj(images).flatten(2).transpose(1, 2)  # (N, width, h, w) -> (N, h * w, width)
        cls = self.cls_token.expand(tokens.size(0), -1, -1).to(tokens.dtype)
        return torch.cat([cls, tokens], dim=1) + self.pos_embed.to(tokens.dtype)


class Attention(nn.Module):
    """Multi-head self-attention, (N, T, width) -> (N, T, width): four nn.Linear (q, k, v, out) around `attend`,
    F.scaled_dot_product_attention unless a script sets another function of (q, k, v, is_causal) (train_sdpa.py
    writes it out). `causal`: position t attends to positions <= t only (the GPT); else to all (the ViT).
    The number of heads is read from the projections' output size (width / head_dim): a rank that holds 1/tp of
    q's, k's and v's output features (ColwiseParallel) runs heads / tp heads unchanged."""

    def __init__(self, width: int, heads: int, causal: bool = False):
        super().__init__()
        if width % heads:
            raise ValueError(f"the width {width} is not a multiple of the {heads} heads")
        self.head_dim, self.causal = width // heads, causal
        self.q, self.k, self.v, self.out = (nn.Linear(width, width) for _ in range(4))
        self.attend = F.scaled_dot_product_attention

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, t = x.shape[:2]
        q, k, v = (proj(x).view(n, t, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        y = self.attend(q, k, v, is_causal=self.causal)  # (N, heads, T, head_dim): softmax(q k^T / sqrt(d) + mask) v
        return self.out(y.transpose(1, 2).reshape(n, t, -1))


class EncoderBlock(nn.Module):
    """One pre-norm transformer block, (N, T, width) -> (N, T, width): x + attn(norm1(x)), then x + mlp(norm2(x))
    with mlp = fc1 (width -> mlp), GELU, fc2 (mlp -> width). No dropout: runs are deterministic for a seed.
    The ViT's blocks and, with `causal=True` (a decoder's masked attention), the GPT's: one block for both, so that
    the parallel scripts' plans (FSDP units, TP's split of q/k/v/out and fc1/fc2, the pipeline's cut) cover both."""

    def __init__(self, width: int, heads: int, mlp: int, causal: bool = False):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(width), Attention(width, heads, causal)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(OrderedDict(fc1=nn.Linear(width, mlp), act=nn.GELU(), fc2=nn.Linear(mlp, width)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ClassifierHead(nn.Module):
    """(N, T, width) tokens -> (N, classes) logits: the final LayerNorm, the class token, a Linear."""

    def __init__(self, width: int, num_classes: int):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(width), nn.Linear(width, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(tokens)[:, 0])


class ViT(nn.Sequential):
    """(N, C, S, S) float32 images -> (N, num_classes) logits: `embed`, `block0` ... `block{depth-1}`, `head`.

    Initialised as timm's ViT (its default scheme): every Linear truncated normal with std 0.02 and zero bias, the
    position embedding truncated normal with std 0.02, the class token normal with std 1e-6, the patch projection as
    a Linear of its fan-in (LeCun normal), LayerNorms 1 and 0, and the classifier zero (as torchvision's ViT), so
    that the first logits are 0 and the first loss is ln(classes). Raises ValueError when S is not a multiple of the
    patch side.
    """

    def __init__(self, image_size: int, in_channels: int, num_classes: int, patch: int, width: int, depth: int,
                 heads: int, mlp: int):  # fmt: skip
        if image_size % patch:
            raise ValueError(f"--model vit needs an image side that is a multiple of {patch} px, not {image_size}")
        stages = [("embed", PatchEmbedding(in_channels, width, patch, (image_size // patch) ** 2))]
        stages += [(f"block{i}", EncoderBlock(width, heads, mlp)) for i in range(depth)]
        super().__init__(OrderedDict([*stages, ("head", ClassifierHead(width, num_classes))]))
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
        embed = self.embed
        nn.init.trunc_normal_(embed.pos_embed, std=0.02)
        nn.init.normal_(embed.cls_token, std=1e-6)
        nn.init.trunc_normal_(embed.proj.weight, std=(1 / (in_channels * patch * patch)) ** 0.5)
        nn.init.zeros_(embed.proj.bias)
        nn.init.zeros_(self.head.fc.weight)

    @property
    def blocks(self) -> list[EncoderBlock]:
        """The encoder blocks in order: what FSDP shards one by one, activation checkpointing recomputes and tensor
        parallelism splits."""
        return [module for module in self if isinstance(module, EncoderBlock)]

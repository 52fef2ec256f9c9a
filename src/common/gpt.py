"""A decoder-only GPT (Radford et al. 2019) of the ViT's blocks with a causal mask, for character-level text.

The same flat `nn.Sequential` of named stages as the ViT (common/vit.py): `embed` (token + position embeddings),
`block0` ... `block{depth-1}` (`EncoderBlock(causal=True)`: pre-norm, separate q/k/v/out projections), `head` (the
final LayerNorm and the LM head). So FSDP shards, activation checkpointing wraps, tensor parallelism splits and the
pipeline cuts the GPT with the ViT's plans: the embeddings land on the first stage, the head on the last.

Weight tying (the LM head sharing the token embedding's matrix, as GPT-2 and nanoGPT do) is left out: with 84
characters it would save 10,752 of 0.8 M parameters (1.3 %), and a matrix shared between the first and the last
stage, or between two FSDP units, is a known pitfall of the parallel scripts (its gradient would have to be summed
across stages) that this collection's lessons are not about.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn as nn

from .vit import EncoderBlock


GPT_CONFIGS = {
    # nanoGPT's laptop shape (its README's CPU line: 4 layers, 4 heads, width 128), MLP 4 x width: 0.8 M parameters
    "gpt": {"width": 128, "depth": 4, "heads": 4, "mlp": 512},
    # GPT-2 small's shape (Radford et al. 2019: 12 layers of 12 heads, width 768, MLP 3072), for a GPU: 85 M parameters
    # with 84 characters (GPT-2's 124 M counts its 50,257-token embedding)
    "gpt2": {"width": 768, "depth": 12, "heads": 12, "mlp": 3072},
    # a wider GPT for a GPU (4 blocks of 16 heads of 128, width 2048, MLP 8192: 201 M parameters): matrices large
    # enough for float8 matmuls to pay (torchao's tables show float8 losing at GPT-2's width and gaining from Llama's)
    "gpt-wide": {"width": 2048, "depth": 4, "heads": 16, "mlp": 8192},
}


class TokenEmbedding(nn.Module):
    """(N, T) int64 tokens -> (N, T, width) float32: a learned vector per token plus one per position (0 .. T-1)."""

    def __init__(self, vocab: int, width: int, context: int):
        super().__init__()
        self.token, self.position = nn.Embedding(vocab, width), nn.Embedding(context, width)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.size(1), device=tokens.device)
        return self.token(tokens) + self.position(positions)


class LMHead(nn.Module):
    """(N, T, width) -> (N, vocab, T) logits: the final LayerNorm and a Linear without bias, the vocabulary on dim 1
    so that `nn.CrossEntropyLoss` takes them against (N, T) targets as the image models' (N, classes) against (N,)."""

    def __init__(self, width: int, vocab: int):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(x)).transpose(1, 2)


class GPT(nn.Sequential):
    """(N, T) int64 tokens, T <= context -> (N, vocab, T) logits: `embed`, `block0` ... `block{depth-1}`, `head`.

    Initialised as GPT-2 (and nanoGPT): every Linear and embedding normal with std 0.02, biases zero, and the two
    projections that write into the residual stream (attention's `out`, the MLP's `fc2`) with std 0.02 / sqrt(2 depth),
    so the residual's variance does not grow with depth. No dropout: runs are deterministic for a seed."""

    def __init__(self, vocab: int, context: int, width: int, depth: int, heads: int, mlp: int):
        stages = [("embed", TokenEmbedding(vocab, width, context))]
        stages += [(f"block{i}", EncoderBlock(width, heads, mlp, causal=True)) for i in range(depth)]
        super().__init__(OrderedDict([*stages, ("head", LMHead(width, vocab))]))
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                residual = name.endswith((".attn.out", ".mlp.fc2"))
                nn.init.normal_(module.weight, std=0.02 / (2 * depth) ** 0.5 if residual else 0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    @property
    def blocks(self) -> list[EncoderBlock]:
        """The decoder blocks in order (as `ViT.blocks`)."""
        return [module for module in self if isinstance(module, EncoderBlock)]

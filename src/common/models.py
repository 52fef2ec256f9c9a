"""The model factory: every script builds its model here, so that every script trains the same model."""

from __future__ import annotations

import torch.nn as nn

from .gpt import GPT, GPT_CONFIGS
from .vit import ViT, vit_config

MODELS = ["cnn", "mlp", "resnet18", "resnet50", "vit", "gpt", "gpt2", "gpt-wide"]
TEXT_MODELS = ("gpt", "gpt2", "gpt-wide")  # trained on tokens (--dataset shakespeare), the others on images
# What each model trains well with, where the command line leaves --lr / --clip-grad-norm out (`cli.parse_args` fills
# them in): the peak learning rate of the scripts' one-cycle schedule (AdamW, weight decay 5e-4) and the clip of the
# gradients' global L2 norm (None: no clipping). The convolutional models and the MLP share 5e-3 (the small CNN reaches
# 91 % on Fashion-MNIST in 2 epochs with it). The ViT, 2 epochs of 8,000 Fashion-MNIST images (train.py on 2 CPU
# cores, `python bench/bench.py --profile vit-defaults`, results/vit-defaults-2026-11-25/): 57.5 % at 5e-3 unclipped,
# 63.8 % clipped to norm 1.0; clipped, 68.2 % at 3e-3, 66.8 % at 2e-3 (68.9 and 69.9 % with seeds 1 and 2), 68.0 % at
# 1e-3, 60.2 % at 5e-4. So 2e-3, the middle of that plateau, with the clip at 1.0 that ViTs are trained with
# (Dosovitskiy et al. 2021, appendix B.1), which keeps a too-high rate from costing as much.
# The GPT (nanoGPT's laptop shape): one epoch cut at 2,800 steps of 16 blocks of 64 characters (2.9 M tokens, under 5
# minutes on 2 CPU cores). The peak rate was swept at 3,000 steps on the first 1,000 held-out blocks (train.py on 2
# cores, results/gpt-defaults-2026-11-25/: 2e-3 1.708, 4e-3 1.700, 6e-3 1.699 nats per character; 8 x 128 characters
# a step 1.719 and 1.725 at 2e-3 and 4e-3; 32 x 64 for 1,500 steps 1.712 at 6e-3); 3,000 steps took 5 min 10 s, so
# the default stops at 2,800. Clipped at 1.0 as nanoGPT and GPT-2 are.
GPT_LR = 6e-3
SCHEDULE_DEFAULTS = {"batch_size": 128, "epochs": 2, "max_steps": None}  # every model's but where DEFAULTS says
DEFAULTS = {
    "cnn": {"lr": 5e-3, "clip_grad_norm": None},
    "mlp": {"lr": 5e-3, "clip_grad_norm": None},
    "resnet18": {"lr": 5e-3, "clip_grad_norm": None},
    "resnet50": {"lr": 5e-3, "clip_grad_norm": None},
    "vit": {"lr": 2e-3, "clip_grad_norm": 1.0},
    "gpt": {"lr": GPT_LR, "clip_grad_norm": 1.0, "batch_size": 16, "epochs": 1, "max_steps": 2800},
    "gpt2": {"lr": 6e-4, "clip_grad_norm": 1.0, "batch_size": 8, "epochs": 1},  # GPT-2 small's (nanoGPT's); not swept
    "gpt-wide": {"lr": 3e-4, "clip_grad_norm": 1.0, "batch_size": 8, "epochs": 1},  # for speed rows; not swept
}


class SmallCNN(nn.Sequential):
    """Two conv blocks and a classifier: (N, C, 28, 28) float32 -> (N, 10) logits; 0.4 M parameters, ~4 MMAC/image.

    Reaches >= 91 % Fashion-MNIST test accuracy in 2 epochs with the scripts' defaults (see results/).
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28):
        side = image_size // 4
        super().__init__(
            nn.Conv2d(in_channels, 32, 3, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * side * side, 128),
            nn.ReLU(inplace=True),
            nn.Linear(128, num_classes),
        )


class MLP(nn.Sequential):
    """Flatten, one hidden layer of 256, ReLU, classifier: (N, C, S, S) -> (N, 10) logits; 0.2 M parameters at 28 px.

    No batch statistics (no BatchNorm, no dropout), so a gradient over a batch is exactly the mean of the gradients
    over its parts: the model for testing gradient accumulation against one big batch.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28):
        super().__init__(
            nn.Flatten(),
            nn.Linear(in_channels * image_size * image_size, 256),
            nn.ReLU(inplace=True),
            nn.Linear(256, num_classes),
        )


def vit_patch_size(image_size: int) -> int:
    """The patch side of `build_model("vit")` for S x S images (`vit_config`): S / 4 below 64 px (the small ViT: 16
    patch tokens), 16 px from 64 px (ViT-B/16). The side must be a multiple of it (`parse_args` checks)."""
    return vit_config(image_size)["patch"]


def build_model(name: str, in_channels: int = 1, image_size: int = 28, num_classes: int = 10) -> nn.Module:
    """`cnn` (SmallCNN), `mlp` (MLP), torchvision ResNet-18/50 or `vit` (common.vit.ViT) with randomly initialised
    weights, for (N, C, S, S) float32 input and (N, num_classes) logits.

    For small images (S < 64, e.g. Fashion-MNIST's 28 px) the ResNet stem is adapted as for CIFAR (He et al. 2016,
    section 4.2): a 3x3 stride-1 first convolution and no max-pool, so 28 px are not shrunk to 7 px by the stem.
    `in_channels` replaces the first convolution's 3.

    `vit` is a Vision Transformer with separate q, k, v projections (common/vit.py says why), its shape from
    `vit_config`: below 64 px a small ViT of S / 4 px patches (28 px: 16 patch tokens + the class token), width 128,
    4 blocks of 4 heads, MLP 512 (0.8 M parameters at 28 px); from 64 px ViT-B/16 (85.8 M parameters at 224 px with
    10 classes). Its patch embedding is a Conv2d of kernel = stride = patch, built for `in_channels` (1 for
    Fashion-MNIST); its blocks are `model.blocks`; no dropout, so runs are deterministic for a seed. Raises
    ValueError when S is not a multiple of the patch side (`vit_patch_size`).

    `gpt`, `gpt2` and `gpt-wide` are decoder-only GPTs (common/gpt.py) for (N, T) int64 tokens -> (N, vocab, T)
    logits: here `in_channels` is the vocabulary size and `image_size` the context T (what `input_shape` gives for
    text); `gpt` has nanoGPT's laptop shape (0.8 M parameters), `gpt2` GPT-2 small's (85 M with 84 characters),
    `gpt-wide` 4 blocks of width 2048 (201 M), GPT_CONFIGS.
    """
    if name == "cnn":
        return SmallCNN(in_channels, num_classes, image_size)
    if name == "mlp":
        return MLP(in_channels, num_classes, image_size)
    if name == "vit":
        return ViT(image_size, in_channels, num_classes, **vit_config(image_size))
    if name in GPT_CONFIGS:  # text: (in_channels, image_size) are (vocabulary size, context), as input_shape gives
        return GPT(in_channels, image_size, **GPT_CONFIGS[name])
    import torchvision  # only for the ResNets: its import adds seconds to start-up

    model = getattr(torchvision.models, name)(weights=None, num_classes=num_classes)
    if image_size < 64:
        model.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
    return model

"""The model factory: every script builds its model here, so that every script trains the same model."""

from __future__ import annotations

import torch.nn as nn

MODELS = ["cnn", "mlp", "resnet18", "resnet50", "vit"]


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
    """The patch side of `build_model("vit")` for S x S images: 4 px below 64 px (the small ViT), 16 px from 64 px
    (ViT-B/16). The side must be a multiple of it (`parse_args` checks)."""
    return 4 if image_size < 64 else 16


def build_model(name: str, in_channels: int = 1, image_size: int = 28, num_classes: int = 10) -> nn.Module:
    """`cnn` (SmallCNN), `mlp` (MLP), torchvision ResNet-18/50 or `vit` (torchvision VisionTransformer) with randomly
    initialised weights, for (N, C, S, S) float32 input and (N, num_classes) logits.

    For small images (S < 64, e.g. Fashion-MNIST's 28 px) the ResNet stem is adapted as for CIFAR (He et al. 2016,
    section 4.2): a 3x3 stride-1 first convolution and no max-pool, so 28 px are not shrunk to 7 px by the stem.
    `in_channels` replaces the first convolution's 3.

    `vit` below 64 px is a small ViT: 4 x 4 patches (28 px: 49 patch tokens + the class token = 50 tokens), width
    128, 6 encoder blocks of 4 heads, MLP 512; 1.2 M parameters at 28 px, about 3.5 minutes per Fashion-MNIST epoch
    (60,000 images) in float32 on 2 AMD EPYC cores. From 64 px it is ViT-B/16 (Dosovitskiy et al. 2021, table 1):
    16 x 16 patches (224 px: 196 + 1 tokens), width 768, 12 blocks of 12 heads, MLP 3072; 85.8 M parameters at
    224 px with 10 classes. Its patch embedding is a Conv2d of kernel = stride = patch, built for `in_channels`
    (1 for Fashion-MNIST). Encoder blocks (`model.encoder.layers`) run nn.MultiheadAttention, which calls
    scaled_dot_product_attention; no dropout, so runs are deterministic for a seed. Raises ValueError when S is not
    a multiple of the patch side (`vit_patch_size`).
    """
    if name == "cnn":
        return SmallCNN(in_channels, num_classes, image_size)
    if name == "mlp":
        return MLP(in_channels, num_classes, image_size)
    import torchvision  # only for the ResNets and the ViT: its import adds seconds to start-up

    if name == "vit":
        patch = vit_patch_size(image_size)
        if image_size % patch:
            raise ValueError(f"--model vit needs an image side that is a multiple of {patch} px, not {image_size}")
        width, depth, heads, mlp = (128, 6, 4, 512) if patch == 4 else (768, 12, 12, 3072)
        model = torchvision.models.VisionTransformer(
            image_size, patch, depth, heads, width, mlp, num_classes=num_classes
        )
        if in_channels != 3:  # initialised as torchvision initialises its own (LeCun normal, zero bias)
            model.conv_proj = nn.Conv2d(in_channels, width, patch, stride=patch)
            fan_in = in_channels * patch * patch
            nn.init.trunc_normal_(model.conv_proj.weight, std=(1 / fan_in) ** 0.5)
            nn.init.zeros_(model.conv_proj.bias)
        return model

    model = getattr(torchvision.models, name)(weights=None, num_classes=num_classes)
    if image_size < 64:
        model.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
    return model

"""common.models: every model maps a batch of images to ten logits."""

import pytest
import torch

import common


@pytest.mark.parametrize("name, channels, size", [("cnn", 1, 28), ("resnet18", 1, 28), ("resnet50", 3, 64)])
def test_models_map_images_to_ten_logits(name, channels, size):
    model = common.build_model(name, channels, size).eval()
    with torch.no_grad():
        logits = model(torch.randn(2, channels, size, size))
    assert logits.shape == (2, 10) and logits.dtype == torch.float32

"""bench/peak.py: training FLOPs counted from a model, and a row's share of a GPU's datasheet peak."""

import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))

import peak  # noqa: E402


def test_datasheet_share_of_an_h100_row():
    """ResNet-50 at 5,812 images/s, 24.3 GFLOPs per image in training (counted here, forward + backward), is about
    141 TFLOP/s: 14 % of an H100 SXM's dense float16 peak (989.4 TFLOP/s, the whitepaper's)."""
    flops = peak.count_flops_per_image("resnet50", 3, 224)
    assert flops == pytest.approx(24.3e9, rel=0.01)
    achieved = flops * 5811.9 / 1e12
    env = {"gpus": ["NVIDIA H100 80GB HBM3"]}
    assert peak.of_datasheet(achieved, "amp float16 + channels_last", env, "resnet50", 1) == pytest.approx(
        achieved / 989.4
    )
    assert peak.of_datasheet(achieved, "fp32 (TF32 convs)", env, "resnet50", 1) == pytest.approx(achieved / 494.7)
    assert peak.of_datasheet(achieved, "fp32", {"gpus": []}, "cnn", 0) is None  # a CPU has no datasheet here
    assert peak.of_datasheet(achieved, "fp32", env, "cnn", 0) is None  # a --device cpu row on a GPU machine
    assert peak.count_flops_per_image("mlp", 1, 28) == 818_176  # the hand count of tests/test_train.py

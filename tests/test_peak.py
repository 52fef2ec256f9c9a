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


def test_a_model_of_matmuls_is_measured_against_the_float32_peak_under_tf32_convs():
    """cuDNN's TF32 covers convolutions only; a GPT's or ViT's float32 matmuls run in float32, so their share is of
    the float32 peak (a GPT-2 row read 12.6 % "of peak" against TF32's on an H200, 86.8 % of float32's)."""
    for model in ("gpt", "gpt2", "vit", "mlp"):
        assert peak.matmul_dtype("fp32 (TF32 convs)", model) == "float32"
    assert peak.matmul_dtype("fp32 (TF32 convs)", "resnet50") == "tf32"
    assert peak.matmul_dtype("amp float16", "gpt2") == "float16"


def test_a_slow_first_call_does_not_end_the_matmul_peak_climb(monkeypatch):
    """A dtype's first matmul can be slow once (CUDA loads its kernels at first use): that alone must not stop the
    climb at the smallest side (an H200's bfloat16 peak read 61 TFLOP/s, at side 1024, when it did). The probe's
    clock is simulated, so the test is deterministic: a call of side n takes n^3 x 1e-11 s (0.2 TFLOP/s at every
    side; 0.69 s at 4096, over the 0.1 s limit), a dtype's first call 1 s more."""
    import types

    import torch

    clock, sides, first = [0.0], [], set()

    def matmul(a, b):
        sides.append((a.dtype, a.shape[0]))
        clock[0] += a.shape[0] ** 3 * 1e-11 + (1.0 if a.dtype not in first else 0.0)
        first.add(a.dtype)
        return a

    monkeypatch.setattr(torch, "matmul", matmul)
    monkeypatch.setattr(peak, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    peaks = peak.measure_gemm_peak(torch.device("cpu"), seconds=1.0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        timed = [n for d, n in sides if d == dtype]
        assert timed[:2] == [1024, 1024] and 2048 in timed and max(timed) == 4096, timed  # slow once, then on
    assert peaks == pytest.approx({"float32": 0.2, "bfloat16": 0.2, "float16": 0.2})

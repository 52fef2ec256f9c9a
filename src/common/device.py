"""The device a script trains on, and what an fp32 model really computes in there."""

from __future__ import annotations

import torch

from .errors import die


def get_device(choice: str = "auto") -> torch.device:
    """`cuda` if asked for or available (with `auto`), else `cpu`. Exits with one line if `cuda` is missing."""
    if choice == "cuda" and not torch.cuda.is_available():
        die("--device cuda was given but torch sees no CUDA GPU (torch.cuda.is_available() is False); use --device cpu")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)


def fp32_precision() -> dict[str, str]:
    """What torch's fp32_precision settings (torch 2.9+) make of a float32 matmul and convolution on CUDA, and of a
    float32 matmul in the CPU's oneDNN: "tf32" (inputs rounded to 10 mantissa bits), "bf16" (oneDNN only) or "ieee"
    (full float32); a setting of "none" inherits its parent's (`torch.backends.cudnn` or `.mkldnn`, then
    `torch.backends`), and "none" all the way up is "ieee". torch's defaults: CUDA matmuls "ieee", convolutions "tf32",
    oneDNN "ieee". Read back from torch: the older global `torch.set_float32_matmul_precision("high")` sets CUDA's
    matmuls and oneDNN's alike, and shows here."""

    def effective(*settings: str) -> str:
        return next((s for s in settings if s != "none"), "ieee")

    root = torch.backends.fp32_precision
    return {
        "cuda.matmul": effective(torch.backends.cuda.matmul.fp32_precision, root),
        "cudnn.conv": effective(torch.backends.cudnn.conv.fp32_precision, torch.backends.cudnn.fp32_precision, root),
        "mkldnn.matmul": effective(
            torch.backends.mkldnn.matmul.fp32_precision, torch.backends.mkldnn.fp32_precision, root
        ),
    }


def precision_label(device: torch.device) -> str:
    """How an fp32 model really computes: on a CUDA GPU with TF32 (compute capability 8.0 or newer: Ampere, Hopper),
    what `fp32_precision` says runs in TF32 (by default the convolutions: "fp32 (TF32 convs)"; train_tf32.py adds the
    matmuls); older GPUs (V100, T4) have no TF32, and a CPU none: "fp32"."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 0):
        return "fp32"
    settings = fp32_precision()
    tf32 = [name for key, name in (("cuda.matmul", "matmuls"), ("cudnn.conv", "convs")) if settings[key] == "tf32"]
    return f"fp32 (TF32 {' and '.join(tf32)})" if tf32 else "fp32"

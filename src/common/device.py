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


def precision_label(device: torch.device) -> str:
    """How an fp32 model really computes: on a CUDA GPU with TF32 (compute capability 8.0 or newer: Ampere, Hopper),
    cuDNN runs convolutions in TF32 unless that is switched off; older GPUs (V100, T4) have no TF32."""
    if device.type == "cuda" and torch.backends.cudnn.allow_tf32 and torch.cuda.get_device_capability(device) >= (8, 0):
        return "fp32 (TF32 convs)"
    return "fp32"

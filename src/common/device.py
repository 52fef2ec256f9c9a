"""The device a script trains on, what an fp32 model really computes in there, and whether it runs bfloat16 natively."""

from __future__ import annotations

import os
import platform

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


# oneDNN's names for the instruction sets up to which ONEDNN_MAX_CPU_ISA lets it go that include bfloat16 dot products
# (AVX512_CORE_BF16, the AMX and AVX10 ones) or leave the limit off (ALL, DEFAULT); any other name stops below them
_BF16_ISA_WORDS = ("BF16", "FP16", "AMX", "AVX10", "ALL", "DEFAULT")


def _isa_limit() -> str:
    """oneDNN's instruction-set limit as set in the environment (ONEDNN_MAX_CPU_ISA, or its older name
    DNNL_MAX_CPU_ISA), upper case; "ALL" when neither is set."""
    return (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL").upper()


def native_bfloat16(device: torch.device) -> bool:
    """Whether `device` computes bfloat16 matmuls in hardware rather than emulating them.

    CUDA: compute capability 8.0 or newer (`torch.cuda.is_bf16_supported(including_emulation=False)`). CPU, x86: torch
    hands a bfloat16 matmul to oneDNN only when `torch.ops.mkldnn._is_mkldnn_bf16_supported()` (else to its own
    scalar loop: about 60x slower than float32, measured on an EPYC limited to AVX2), and oneDNN runs it on bfloat16
    dot-product instructions only with AVX512-BF16 or AMX (an AVX512 CPU without them converts to float32: about 1.2x
    slower than float32); both must hold, and `ONEDNN_MAX_CPU_ISA` below AVX512_CORE_BF16 (e.g. AVX2) switches them
    off, which is how a CPU without them can be tried on one that has them (so does `torch.backends.mkldnn.enabled =
    False`). Other CPUs (aarch64): oneDNN's own check, which asks for the BF16 extension (Graviton 3, Apple M2 and
    newer; not measured here). Any other device: False."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type != "cpu":
        return False
    try:
        onednn = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()) and torch.backends.mkldnn.enabled
    except (AttributeError, RuntimeError):  # a torch built without oneDNN
        return False
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return onednn
    instructions = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return onednn and instructions and any(word in _isa_limit() for word in _BF16_ISA_WORDS)


def bfloat16_emulated(device: torch.device) -> str:
    """Why `device` emulates bfloat16, in words for a one-line message (for a device where `native_bfloat16` is
    False): the oneDNN limit when one is set, else the instructions the CPU lacks, else the GPU's generation."""
    if device.type == "cuda":
        return "this GPU has no native bfloat16 (compute capability 8.0+)"
    limit = _isa_limit()
    if not any(word in limit for word in _BF16_ISA_WORDS):
        return f"bfloat16 is emulated here (ONEDNN_MAX_CPU_ISA={limit} keeps oneDNN below AVX512-BF16)"
    if not torch.backends.mkldnn.enabled:
        return "bfloat16 is emulated here (torch.backends.mkldnn.enabled is False)"
    return "this CPU has no bfloat16 instructions (AVX512-BF16 or AMX): bfloat16 is emulated, slower than float32"

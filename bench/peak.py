"""How close to the hardware's limit: the device's dense matmul peak measured per dtype, the datasheet peaks of
known GPUs, a row's share of each, and training FLOPs per image counted from a model."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

import common

REPO = Path(__file__).resolve().parent.parent

# Dense (no sparsity) peak TFLOP/s per dtype of known GPUs, from NVIDIA's published figures: the of-datasheet column.
# The datasheets print the tensor-core figures with 2:4 sparsity; the dense ones are half, as the whitepapers list.
DATASHEET_PEAKS = {
    "H100 80GB HBM3": (  # H100 SXM5
        {"float16": 989.4, "bfloat16": 989.4, "tf32": 494.7, "float32": 66.9},
        "NVIDIA H100 Tensor Core GPU Architecture whitepaper, H100 SXM5: dense FP16/BF16 tensor 989.4, TF32 494.7, "
        "FP32 66.9 TFLOP/s",
    ),
    "H100 PCIe": (
        {"float16": 756.5, "bfloat16": 756.5, "tf32": 378.0, "float32": 51.2},
        "NVIDIA H100 Tensor Core GPU Architecture whitepaper, H100 PCIe: dense FP16/BF16 tensor 756.5, TF32 378.0, "
        "FP32 51.2 TFLOP/s",
    ),
    "H200": (
        {"float16": 989.4, "bfloat16": 989.4, "tf32": 494.7, "float32": 66.9},
        "NVIDIA H200 datasheet (SXM): FP16/BF16 tensor 1,979 and TF32 989 TFLOP/s with sparsity (dense: half), FP32 67",
    ),
    "A100": (
        {"float16": 312.0, "bfloat16": 312.0, "tf32": 156.0, "float32": 19.5},
        "NVIDIA A100 Tensor Core GPU datasheet: dense FP16/BF16 tensor 312, TF32 156, FP32 19.5 TFLOP/s",
    ),
}


def measure_gemm_peak(device: torch.device, seconds: float = 1.0) -> dict[str, float]:
    """The device's dense matmul throughput, measured: TFLOP/s of `torch.matmul` on two square random matrices, per
    dtype: float32 (on CUDA with TF32 off), tf32 (CUDA: float32 inputs, TensorFloat-32 tensor cores), bfloat16 and
    float16 (on a CPU without native support these run emulated and show it). The best of three sides (2048, 4096,
    8192 on CUDA; 1024, 2048, 4096 on a CPU), each timed for a third of `seconds` after two warm-up calls, tried
    smallest first: a side whose calls take over a tenth of `seconds` (two in a row: a first call may load kernels)
    ends the climb untimed (emulated dtypes, slow CPUs), and a dtype that slow at the smallest side is timed at the
    largest smaller side (512, 256 ...) where one call is quick enough. Why several sides: the fastest one differs
    by machine and dtype (an AMX Xeon's bfloat16 ran 1.40 TFLOP/s at 1024 and 2.53 at 2048), so one fixed side
    understates the peak and overstates every share of it. A matmul of side n is 2 n^3 FLOPs. This is
    the ceiling a training run's matmuls and convolutions can reach in that dtype on this machine (what cuBLAS or
    oneDNN/MKL achieve), usually below the datasheet's peak. A few seconds in all."""
    cuda = device.type == "cuda"
    sides = [2048, 4096, 8192] if cuda else [1024, 2048, 4096]
    peaks = {}

    def matmul(a, b) -> float:  # one call, finished (CUDA queues it: wait for it); its seconds
        start = time.perf_counter()
        torch.matmul(a, b)
        if cuda:
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    def rate(side: int, dtype: torch.dtype, budget: float) -> float | None:  # TFLOP/s at this side, None if too slow
        a, b = (torch.randn(side, side, device=device).to(dtype) for _ in range(2))
        # a first call can be slow once (CUDA loads a dtype's kernels at their first use): only a second slow call
        # says the side is too slow (an H200's bfloat16 read 61 TFLOP/s, at side 1024, when the first call decided)
        if matmul(a, b) > seconds / 10 and side > 128 and matmul(a, b) > seconds / 10:
            return None
        matmul(a, b)  # a second warm-up call (handles, kernel choice, threads are ready)
        calls, elapsed = 0, 0.0
        while elapsed < budget or not calls:
            elapsed += matmul(a, b)
            calls += 1
        return 2 * side**3 * calls / elapsed / 1e12

    setting = torch.backends.cuda.matmul.fp32_precision  # torch's current API (allow_tf32 is the deprecated one)
    try:
        for name, dtype, precision in [
            ("float32", torch.float32, "ieee"),
            *([("tf32", torch.float32, "tf32")] if cuda else []),
            ("bfloat16", torch.bfloat16, "ieee"),
            ("float16", torch.float16, "ieee"),
        ]:
            torch.backends.cuda.matmul.fp32_precision = precision
            rates = []
            for side in sides:  # growing: a side whose one call is slow stops the growth (and is not timed)
                if (r := rate(side, dtype, seconds / len(sides))) is None:
                    break
                rates.append(r)
            side = sides[0] // 2
            while not rates:  # slow at the smallest side already: halve until one call is quick enough
                rates = [r] if (r := rate(side, dtype, seconds)) is not None else []
                side //= 2
            peaks[name] = max(rates)
    finally:
        torch.backends.cuda.matmul.fp32_precision = setting
    return peaks


def matmul_dtype(precision, model=None) -> str:
    """The dtype a run's matmuls and convolutions ran in, from its metrics' `precision` (e.g. "amp bfloat16 +
    channels_last", "fp32 (TF32 convs)", "fp32") and model: the key of `gemm_peak_tflops` its of-peak share is taken
    against. "TF32 convs" is cuDNN's default for convolutions; matmuls stay float32 (torch's default), so a model
    whose FLOPs are matmuls (mlp, vit, gpt, gpt2) is measured against the float32 peak."""
    text = str(precision)
    if "float8" in text:  # torchao's float8 matmuls: no probe measures their peak, so no of-peak share
        return "float8"
    for name in ("bfloat16", "float16"):
        if name in text:
            return name
    if "TF32 matmuls" in text:  # train_tf32.py: every float32 matmul and convolution on TF32 tensor cores
        return "tf32"
    return "tf32" if "TF32" in text and model not in ("mlp", "vit", "gpt", "gpt2", "gpt-wide") else "float32"


def of_peak(achieved, precision, env: dict, model=None, gpus=0):
    """achieved TFLOP/s (all devices of the run together) over the measured matmul peak of one device in the run's
    dtype (`measure_gemm_peak`) times the GPUs it used (on a CPU the processes share the one measured), or None."""
    devices = int(gpus) if pd.notna(gpus) and gpus else 1
    return _share(achieved, env.get("gemm_peak_tflops") or {}, precision, model, devices)


def _share(achieved, peaks: dict, precision, model, devices: int):
    """achieved TFLOP/s over `peaks`' entry for the run's dtype (`matmul_dtype`) times `devices`, or None; None too
    when the run beat the peak, which then was not one (on a CPU without bf16 instructions the probe's emulated bf16
    matmul runs slower than oneDNN's bf16 convolutions)."""
    peak = peaks.get(matmul_dtype(precision, model))
    share = achieved / (peak * devices) if peak and pd.notna(achieved) and achieved else None
    return share if share is None or share <= 1.0 else None


def gemm_peak_in_a_child(python: str, gpus: int, seconds: float = 1.0) -> dict[str, float]:
    """`measure_gemm_peak` in a subprocess, so that this process never holds a CUDA context or cached blocks on a
    GPU the runs train on. {} (and a line) if it fails."""
    code = (
        f"import json, sys, torch; sys.path[:0] = [{str(REPO / 'bench')!r}, {str(REPO / 'src')!r}]; import peak; "
        f"print(json.dumps(peak.measure_gemm_peak(torch.device({'cuda' if gpus else 'cpu'!r}), {float(seconds)})))"
    )
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        print(f"bench: the matmul peak could not be measured: {proc.stderr.strip()[-300:]}", file=sys.stderr)
        return {}


def datasheet(env: dict) -> tuple[dict, str] | None:
    """(dense peak TFLOP/s by dtype, source) of the run's GPU when it is in DATASHEET_PEAKS, else None (a CPU,
    an unknown GPU)."""
    for name in (env.get("gpus") or [])[:1]:
        for key, value in DATASHEET_PEAKS.items():
            if key in name and "NVL" not in name:  # H200 NVL / H100 NVL have lower clocks: not listed
                return value
    return None


def of_datasheet(achieved, precision, env: dict, model=None, gpus=0):
    """achieved TFLOP/s (all GPUs of the run) over the datasheet's dense peak of the run's dtype times its GPUs, or
    None (no datasheet for this device, nothing counted)."""
    sheet = datasheet(env)
    if not sheet or not pd.notna(gpus) or not gpus:  # a run on the CPU of a GPU machine has no GPU datasheet
        return None
    return _share(achieved, sheet[0], precision, model, int(gpus))


def peak_line(env: dict) -> str:
    """The measured matmul peaks of env.json, e.g. "float32 1.2, bfloat16 3.4 TFLOP/s", or "not measured"."""
    peaks = env.get("gemm_peak_tflops") or {}
    return ", ".join(f"{k} {v:.3g}" for k, v in peaks.items()) + " TFLOP/s" if peaks else "peak not measured"


def count_flops_per_image(model: str, channels: int, image_size: int) -> float:
    """Training FLOPs of one image (forward + backward of `model` on a (2, channels, image_size, image_size) float32
    batch, cross-entropy loss), counted with the Meter's counter (`common.meter.flop_counter`: torch.utils.flop_counter,
    causal attention over the lower triangle) on the CPU, divided by 2. The count depends on the shapes only, not on
    the device, dtype or memory format: the same number the Meter counts in a run."""
    net = common.build_model(model, channels, image_size)
    x, y = torch.randn(2, channels, image_size, image_size), torch.tensor([0, 1])
    with common.meter.flop_counter() as counter:
        torch.nn.functional.cross_entropy(net(x), y).backward()
    return counter.get_total_flops() / 2

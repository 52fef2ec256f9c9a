"""Provenance: the versions, the hardware (CPU model and its bf16 instruction sets, GPUs) and the git commit."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path

import torch
import torch.distributed as dist

from .device import native_bfloat16

REPO = Path(__file__).resolve().parents[2]  # the repository: src/common/env.py -> ../..
# The variables that keep torch's CPU kernels below what the CPU has: oneDNN's (ONEDNN_MAX_CPU_ISA), ATen's and
# Inductor's vector code (ATEN_CPU_CAPABILITY) and MKL's (MKL_ENABLE_INSTRUCTIONS). Set to AVX2 together, a CPU with
# AVX512-BF16 runs what a CPU without bf16 instructions runs; a number measured so is labelled with them.
ISA_LIMITS = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run(argv: list[str]) -> str | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def limited_inductor_cache() -> str | None:
    """The Inductor cache folder for a process whose ATEN_CPU_CAPABILITY limits its vector code (e.g. avx2), None
    without a limit: the default folder with the limit appended (/tmp/torchinductor_USER-avx2). torch 2.15 keys its
    compiled-graph cache without the vector instruction set, so a graph compiled under the limit and loaded by a run
    without it crashed that run ("corrupted size vs. prev_size", seen on train_fast.py's GPT), and the other way round
    an AVX2 measurement would run AVX512 code. The bench and the tests set TORCHINDUCTOR_CACHE_DIR to it. Leaves
    os.environ as it found it (importing torch._inductor would set TORCHINDUCTOR_CACHE_DIR to the default folder)."""
    capability = os.environ.get("ATEN_CPU_CAPABILITY")
    if not capability:
        return None
    caller = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # importing torch._inductor sets the

    if caller is None:  # variable to the default folder when unset: unset again, so that the caller can still set it
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    return f"{default_cache_dir()}-{capability.lower()}"


def cpu_info() -> dict:
    """The CPU model (from /proc/cpuinfo, else `platform.processor()`) and which of the instruction sets that decide
    low-precision speed it has: avx2, avx512f, avx512_bf16 (bf16 dot products), amx_tile / amx_bf16 (Intel AMX).
    `bf16_instructions` is True when either bf16 set is there: bfloat16 autocast then runs natively on the CPU,
    otherwise it is emulated and slower than float32. `bf16_native`: what the scripts go by (common.device's
    `native_bfloat16`: the instructions, and oneDNN allowed to use them), `isa_limits`: those of ISA_LIMITS set."""
    model, flags = None, set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model is None:
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    wanted = ["avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"]
    return {
        "cpu_model": model or platform.processor() or platform.machine(),
        "cpu_flags": [f for f in wanted if f in flags],
        "bf16_instructions": bool({"avx512_bf16", "amx_bf16"} & flags),
        "bf16_native": native_bfloat16(torch.device("cpu")),
        "isa_limits": {name: os.environ[name] for name in ISA_LIMITS if os.environ.get(name)},
    }


def gpu_info() -> list[dict]:
    """Per GPU as nvidia-smi reports it: name, driver, memory, current and maximum SM clock (MHz); [] without one."""
    out = _run(
        [
            "nvidia-smi",
            "--query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm",
            "--format=csv,noheader,nounits",
        ]
    )
    keys = ["name", "driver", "memory_mib", "sm_clock_mhz", "max_sm_clock_mhz"]
    return [dict(zip(keys, (v.strip() for v in line.split(",")), strict=False)) for line in (out or "").splitlines()]


def git_state() -> dict:
    """The commit of the checkout and whether tracked files differ from it. `SPEEDUPS_COMMIT`, when set, wins: a
    tree copied to another machine may carry no .git, or a stale one (dirty then says None: not checked)."""
    if os.environ.get("SPEEDUPS_COMMIT"):
        return {"commit": os.environ["SPEEDUPS_COMMIT"], "dirty": None}
    commit = _run(["git", "-C", str(REPO), "rev-parse", "HEAD"])
    if commit is None:
        return {"commit": None, "dirty": None}
    dirty = _run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"])
    return {"commit": commit, "dirty": bool(dirty)}


def environment() -> dict:
    """Versions and hardware: python, torch, torchvision, DALI, CUDA, cuDNN, GPU names, driver and clocks, CPU model
    and its bf16-relevant instruction sets, core count, hostname, and the git commit."""
    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchvision": _version("torchvision"),
        "dali": _version("nvidia-dali-cuda120") or _version("nvidia-dali-cuda130"),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "gpu_info": gpu_info() if cuda else [],
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cpu": platform.processor() or platform.machine(),
        **cpu_info(),
        "hostname": socket.gethostname(),
        "git": git_state(),
    }


def in_process_group() -> bool:
    """Whether this process belongs to an initialised default process group of torch.distributed (torchrun's
    processes, after `init_process_group`); False in a single process and where torch has no distributed support."""
    return dist.is_available() and dist.is_initialized()


def require_torch(version: str, what: str) -> None:
    """Exit with one line (exit 2) when the installed torch is older than `version` ("2.15"), naming `what` needs it
    and the version it was tested on; the local build suffix (+cu132) and pre-release tags are ignored."""
    from .errors import die

    def parts(text: str) -> tuple[int, ...]:
        return tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in text.split("+")[0].split(".")[:2])

    if parts(torch.__version__) < parts(version):
        die(
            f"{what} needs torch >= {version} (tested on {version}); this is torch {torch.__version__}: "
            "pip install -U torch"
        )

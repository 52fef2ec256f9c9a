"""Seeds for every random number generator, the reproducibility switches, and the DataLoader workers' seeds."""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def seed_everything(seed: int, deterministic: bool = False) -> torch.Generator:
    """Seed Python, NumPy and torch (all devices); return a torch.Generator for the DataLoader's shuffling.

    With `deterministic`, also ask for reproducible kernels, following
    https://pytorch.org/docs/stable/notes/randomness.html: `torch.use_deterministic_algorithms(True, warn_only=True)`
    (deterministic kernels where torch has them; an op without one warns once naming itself and runs as usual, so the
    run repeats bit for bit only if no such warning was printed), cuDNN without autotuning (`benchmark = False`,
    `deterministic = True`) and the cuBLAS workspace setting CUDA >= 10.2 needs (`CUBLAS_WORKSPACE_CONFIG=:4096:8`,
    set before the first cuBLAS call). DataLoader workers are seeded by `seed_worker` (through
    `preemption.init_worker`) from torch's global generator, seeded here; the returned generator is the shuffle's (the
    scripts reseed it with seed + epoch at each epoch), so two runs with the same seed see the same batches.
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    return torch.Generator().manual_seed(seed)


def seed_worker(worker_id: int) -> None:
    """Seed NumPy and `random` in a DataLoader worker from torch's per-worker seed: torch seeds each worker as
    base_seed + worker_id, but not NumPy or `random`; the recipe of
    https://pytorch.org/docs/stable/notes/randomness.html#dataloader. The scripts' `worker_init_fn` is
    `preemption.init_worker`, which calls it."""
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)

"""Seeds for every random number generator, the reproducibility switches, and the DataLoader workers' seeds."""

from __future__ import annotations

import os
import random
import signal
import threading

import numpy as np
import torch


def seed_everything(seed: int, deterministic: bool = False) -> torch.Generator:
    """Seed Python, NumPy and torch (all devices); return a torch.Generator for the DataLoader's shuffling.

    With `deterministic`, also ask for reproducible kernels, following
    https://pytorch.org/docs/stable/notes/randomness.html: `torch.use_deterministic_algorithms(True, warn_only=True)`
    (deterministic kernels where torch has them; an op without one warns once naming itself and runs as usual, so the
    run repeats bit for bit only if no such warning was printed), cuDNN without autotuning (`benchmark = False`,
    `deterministic = True`) and the cuBLAS workspace setting
    CUDA >= 10.2 needs (`CUBLAS_WORKSPACE_CONFIG=:4096:8`, set before the first cuBLAS call). DataLoader workers are
    seeded by `seed_worker` from torch's global generator, seeded here; the returned generator is the shuffle's (the
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
    """DataLoader `worker_init_fn`: seed NumPy and `random` in each worker from torch's per-worker seed.

    torch seeds each worker as base_seed + worker_id, but not NumPy or `random`; this is the recipe from
    https://pytorch.org/docs/stable/notes/randomness.html#dataloader. It also makes the worker ignore SIGTERM
    from any process but the main one: a preemption signal sent to every process of a job must not kill the workers
    while the main process finishes its step (`Preemption`); the main process's SIGTERM at its exit ends them.
    """
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)
    # SIGTERM from another process than the main one (Slurm signals every process of a job, `timeout` its group)
    # must not kill this worker while the main process finishes its step (`Preemption`); the main process's own
    # SIGTERM, at its exit, still ends it. A thread waits for the blocked signal, which says who sent it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    threading.Thread(target=_exit_on_sigterm_from, args=(os.getppid(),), daemon=True).start()


def _exit_on_sigterm_from(parent: int) -> None:
    """A DataLoader worker's SIGTERM, as torch's own handler treats it (torch/csrc/DataLoader.cpp) but ignored, not
    fatal, when another process than `parent` sent it: exit at once when the main process sends it."""
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
            os._exit(0)

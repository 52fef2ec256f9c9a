"""Preemption: SIGTERM stops a run at a step boundary, saved."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from .env import in_process_group
from .errors import one_line
from .runstate import RunState
from .seeding import seed_worker


class Preemption:
    """What a training loop does with SIGTERM, the signal Slurm (`#SBATCH --signal=TERM@120`), Kubernetes, `timeout`
    and torchrun (passing on its own) send before they kill a job: finish the step in flight, save, leave.

    Creating it installs the SIGTERM handler, which only sets a flag: the step in flight runs to its end. Use:
    `if preemption.requested(step): break` at the top of each step, then, after the loop, save a checkpoint at that
    step boundary and skip the evaluation when `preemption.stopped_at` is set; `report` writes the metrics of what
    finished with status "terminated"; `preemption.exit()` as the script's last line prints one line and exits 143
    (128 + 15, the shell's code for SIGTERM). A second SIGTERM while the run still trains ends the process at once, as
    without the handler; one that comes within a second of the first is the same signal passed on, not a second one
    (Slurm signals every process of a job step, torchrun too, and torchrun passes it on to its workers at once). Once
    the run has stopped at its step boundary (`requested` said so), further SIGTERMs are ignored: the process is
    already saving and leaving, and torchrun sends one to every worker still running as soon as another exits 143,
    which would otherwise cut the stopping rank's checkpoint, metrics or closing line short (torchrun follows it with
    SIGKILL after its grace period, 30 s).

    Under torch.distributed (created after `init_process_group`, by every rank), `requested` all-reduces the flag
    (MAX) at every step boundary, so every rank stops at the same step even when the signal reaches them at different
    moments, and no rank is left waiting in a collective the others will never join. The all-reduce runs on a gloo
    group of CPU tensors (a new one when the default group is NCCL): it never synchronises a GPU stream. Its cost,
    measured (bench/studies/preemption_cost.py, results/preemption-cost-2026-11-25/): 563 us a call on 2 CPU
    processes, 0.69 % of train_DDP.py's 82 ms small-CNN step, and 5 interleaved pairs of runs with and without it
    differ by 0.92x to 1.18x, so it is not measurable in images/s: it runs at every step, where a signal is seen
    soonest. DataLoader workers ignore SIGTERM from other processes (`init_worker`): a signal sent to the whole
    process group (Slurm, `timeout`) must not kill them under a main process that is still finishing its step.
    """

    def __init__(self, run: RunState, master: bool | None = None):
        """`run`: the run's RunState (`args.run`), where the stop is recorded for `report` and the failed writes and
        last checkpoint are read at `exit`; `master`: whether this process says where the run stopped (the one that
        writes the checkpoint); default: rank 0, or the only process."""
        self.run = run
        self._signalled = 0.0  # when the first SIGTERM came (time.monotonic), 0 before
        self.stopped_at = None  # the step the run stopped at, once `requested` said so
        signal.signal(signal.SIGTERM, self._handle)
        distributed = in_process_group() and dist.get_world_size() > 1
        self._group = None
        self._master = (not distributed or dist.get_rank() == 0) if master is None else master  # the one that prints
        if distributed:
            self._group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD

    def _handle(self, signum, frame) -> None:
        now = time.monotonic()
        if self._signalled and now - self._signalled > 1.0 and self.stopped_at is None:  # a second one: die now
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        self._signalled = self._signalled or now  # (seconds; within 1 s of the first, the same signal passed on)

    def requested(self, step: int) -> bool:
        """Whether the run stops before its next step: True once this process (or, under torch.distributed, any
        rank) got SIGTERM. Records `step` (the global step count so far: the boundary) in `stopped_at` and in the
        RunState's, which `report` reads."""
        stop = bool(self._signalled)
        if self._group is not None:
            flag = torch.tensor([int(stop)])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
            stop = bool(flag.item())
        if stop and self.stopped_at is None:
            self.stopped_at = self.run.stopped_at = step
        return stop

    def exit(self) -> None:
        """The script's last line. After a failed checkpoint write (its line was printed then): exit 1. After a
        SIGTERM that stopped the run: rank 0 prints "terminated by SIGTERM at step N; ..." on stderr, saying which
        checkpoint holds that step (resume with --resume) or that none does, and every rank exits 143. Otherwise
        (a SIGTERM that came after the last step changes nothing) it returns."""
        if self.run.failed_writes:
            raise SystemExit(1)
        step = self.run.stopped_at
        if step is None:
            return
        if self._master:
            saved = self.run.saved
            where = (
                f"{saved[0]} holds it: resume with --resume"
                if saved and saved[1] == step
                else "no --checkpoint-dir, so nothing to resume from"
            )
            line = one_line(f"{Path(sys.argv[0]).name}: terminated by SIGTERM at step {step}; {where}")
            print(line, file=sys.stderr, flush=True)
        raise SystemExit(143)


def init_worker(worker_id: int) -> None:
    """DataLoader `worker_init_fn`: `seed_worker` (NumPy and `random` seeded from torch's per-worker seed), and
    SIGTERM from any process but the main one ignored. Slurm signals every process of a job and `timeout` its process
    group: the workers must not die of it while the main process finishes its step and saves (`Preemption`); the main
    process's own SIGTERM to them, at its exit, still ends them (as torch's handler in torch/csrc/DataLoader.cpp
    would). The signal is blocked, and a thread waits for it, which tells who sent it."""
    seed_worker(worker_id)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    threading.Thread(target=_exit_on_sigterm_from, args=(os.getppid(),), daemon=True).start()


def _exit_on_sigterm_from(parent: int) -> None:
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
            os._exit(0)

"""Run a training script inside this (torchrun) worker and kill a worker at chosen step boundaries, one per attempt:
faults injected at known moments, so that a restart test does not depend on timing.

    torchrun --max-restarts 3 ... tests/crash_probe.py ATTEMPT:WHEN:N:RANK[,...] -- src/train_DDP_elastic.py <flags>

In torchrun's attempt ATTEMPT (TORCHELASTIC_RESTART_COUNT, 0 for the first), the worker with RANK=RANK dies: with
WHEN `after-save`, right after its N-th common.save_checkpoint call of that attempt returns (between two steps, with
that checkpoint on disk); with `in-evaluate`, as its N-th common.evaluate call starts (during the evaluation that
follows an epoch's last step); with `in-async-write`, as the background thread of its N-th asynchronous DCP save
(torch.distributed.checkpoint.async_save) starts writing the shards: the previous save whole on disk, this one not.
It dies by SIGKILL, as a preempted or OOM-killed worker does: no cleanup, no exception.
With WHEN `overlap`, nobody dies: the writer of the N-th asynchronous save holds its write until the training loop has
started a step after the one the save was issued at (at most 60 s; then the write raises): a save that waits for its
own write before training goes on, which is no async save, fails the run instead of passing unnoticed.
With WHEN `sigterm-at-step`, the worker instead gets SIGTERM at the step boundary after global step N (as the
preemption check of step N + 1 starts), as a preempted job does: the script stops there, saves and exits 143.
The script runs unchanged (runpy, as `__main__`); the common functions are observed, not replaced.
"""

import os
import runpy
import signal
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

import common  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

attempt, rank = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"), os.environ["RANK"]
plan = [spec.split(":") for spec in sys.argv[1].split(",")]
when, n = next(((w, int(k)) for a, w, k, r in plan if a == attempt and r == rank), (None, 0))  # this worker's fault
calls = {"after-save": 0, "in-evaluate": 0, "in-async-write": 0}  # sigterm-at-step counts steps, not calls
progress = {"step": -1, "issued_at": []}  # the training loop's last step boundary; the step of each async save
stepped = threading.Condition()  # notified at every step boundary of the training loop


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def observed_save(*args, **kwargs):
    result = save_checkpoint(*args, **kwargs)
    calls["after-save"] += 1
    if when == "after-save" and calls["after-save"] == n:
        die()
    return result


def observed_evaluate(*args, **kwargs):
    calls["in-evaluate"] += 1
    if when == "in-evaluate" and calls["in-evaluate"] == n:
        die()
    return evaluate(*args, **kwargs)


def observed_write_data(self, *args, **kwargs):
    if threading.current_thread() is not threading.main_thread():  # an async save's writer (a sync save: the main)
        calls["in-async-write"] += 1
        if when == "in-async-write" and calls["in-async-write"] == n:
            die()
        if when == "overlap" and calls["in-async-write"] == n:
            issued_at = progress["issued_at"][n - 1]
            with stepped:
                if not stepped.wait_for(lambda: progress["step"] > issued_at, timeout=60):
                    raise RuntimeError(f"crash_probe: no training step ran during async save {n} (issued at step "
                                       f"{issued_at}): the loop waited for the write")  # fmt: skip
    return write_data(self, *args, **kwargs)


def observed_async_save(*args, **kwargs):
    progress["issued_at"].append(progress["step"])
    return async_save(*args, **kwargs)


class ObservedPreemption(common.Preemption):
    def requested(self, step: int) -> bool:
        with stepped:
            progress["step"] = step
            stepped.notify_all()
        if when == "sigterm-at-step" and step == n and not self._signalled:
            os.kill(os.getpid(), signal.SIGTERM)
            while not self._signalled:  # the handler runs in the main thread between two bytecodes
                time.sleep(0.001)
        return super().requested(step)


save_checkpoint, evaluate = common.save_checkpoint, common.evaluate
common.save_checkpoint, common.evaluate = observed_save, observed_evaluate
common.Preemption = ObservedPreemption
write_data, dcp.FileSystemWriter.write_data = dcp.FileSystemWriter.write_data, observed_write_data
async_save, dcp.async_save = dcp.async_save, observed_async_save
script = str(REPO / sys.argv[sys.argv.index("--") + 1])
sys.argv = [script, *sys.argv[sys.argv.index("--") + 2 :]]
runpy.run_path(script, run_name="__main__")

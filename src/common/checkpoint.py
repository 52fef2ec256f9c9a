"""Checkpoints: what a resume must share with the run that saved it, saved atomically, refused in one line."""

from __future__ import annotations

import argparse
import os
import pickle
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from .env import in_process_group
from .errors import die, first_line
from .models import TEXT_MODELS
from .io import WriteFailed, atomic_write
from .runstate import RUN

# 1: the files before 2026-11-23 (no version, no made_by); 2: + format, made_by, state holders; 3: + subset, seed,
# accumulation steps in made_by; 4: + epochs, max steps, peak learning rate
CHECKPOINT_FORMAT = 4
# What a checkpoint must share with the run that resumes it: what fixes the model, the optimizer, which samples an
# epoch's steps take in which order (a mid-epoch resume skips the done steps' samples, so --subset, --seed and
# --accum-steps must not change), and the one-cycle schedule (--epochs and --max-steps fix its length, --lr its peak:
# another value would reshape it mid-run, silently), and the pipelines' stage cut (--balance: train_pipeline.py keeps
# one optimizer state per stage, which fits only the cut that saved it). Anything else (workers, log interval,
# warm-up...) may change.
CHECKPOINT_MATCH = {
    "script": "script",
    "model": "model",
    "dataset": "dataset",
    "image_size": "image size",
    "seq_len": "context (--seq-len)",
    "subset": "subset",
    "seed": "seed",
    "world_size": "world size",
    "batch_size": "batch per process",
    "accum_steps": "accumulation steps",
    "optimizer": "optimizer",
    "state": "extra state",
    "epochs": "epochs",
    "max_steps": "max steps",
    "lr": "peak learning rate",
    "muon_lr": "Muon's peak learning rate (--muon-lr)",
    "balance": "stage cut (--balance)",
    "schedule": "pipeline schedule (--schedule)",
    "stages_per_rank": "stages per process (--stages-per-rank)",
    "tp": "tensor-parallel ranks (--tp)",
}


def checkpoint_origin(args: argparse.Namespace, optimizer: torch.optim.Optimizer | None, **holders) -> dict:
    """What a checkpoint of this run says made it (`made_by`), keyed like CHECKPOINT_MATCH: the script's file name,
    --model, --dataset (a loader's --data-dir folder name), --image-size, --subset, --seed, the world size
    (torch.distributed's, else 1), --batch-size (per process), --accum-steps (None where the script has no such flag),
    the optimizer's class, `state`: the names of the `holders` (GradScaler...) whose state_dict is not empty (a
    disabled GradScaler has none), what fixes the one-cycle schedule: --epochs, --max-steps, --lr (the resolved
    peak, a model's default included), --muon-lr (train_muon.py's), --balance, --schedule and --stages-per-rank
    (None where the script cuts no stages), --tp (None where there is no 2-D mesh). Plus the torch version, for the
    record."""
    dataset = getattr(args, "dataset", None) or Path(getattr(args, "data_dir", "")).resolve().name
    return {
        "script": Path(sys.argv[0]).name,
        "model": args.model,
        "dataset": dataset,
        "image_size": getattr(args, "image_size", None),
        "seq_len": args.seq_len if args.model in TEXT_MODELS else None,  # None for images (and files before it)
        "subset": getattr(args, "subset", None),
        "seed": args.seed,
        "world_size": dist.get_world_size() if in_process_group() else 1,
        "batch_size": args.batch_size,
        "accum_steps": getattr(args, "accum_steps", None),
        "optimizer": type(optimizer).__name__ if optimizer is not None else None,
        "state": sorted(name for name, holder in holders.items() if holder.state_dict()),
        "epochs": args.epochs,
        "max_steps": args.max_steps,
        "lr": args.lr,
        "muon_lr": getattr(args, "muon_lr", None),  # train_muon.py's second schedule (None elsewhere, and before it)
        "balance": getattr(args, "balance", None),  # None for the scripts without stages (and files before it)
        "schedule": getattr(args, "schedule", None),  # a pipeline's: with the next, which rank holds which stage
        "stages_per_rank": getattr(args, "stages_per_rank", None),
        "tp": getattr(args, "tp", None),  # 2-D: with the world size, the groups and the global batch
        "torch": str(torch.__version__),
    }


def _alive(pid: int) -> bool:
    """Whether process `pid` exists (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _shown(value) -> str:
    """A made_by value in a message: lists joined by commas, empty ones and None as "none"."""
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return "none" if value is None else str(value)


def save_checkpoint(
    path: Path, args: argparse.Namespace, model: nn.Module | dict, optimizer: torch.optim.Optimizer | None, epoch: int,
    step: int, epochs: list[dict] | None = None, **extra,
) -> bool:  # fmt: skip
    """Save model and optimizer state, the number of finished `epoch`s, the global `step`, the per-epoch records
    `epochs` and `extra` to `path`.

    `model` is a module or its state dict (FSDP gathers a full one); `optimizer` None leaves the optimizer's state out
    (FSDP keeps it in its sharded checkpoint). `epochs` is the script's list of `epoch_record` dicts (plain numbers and
    strings), the metrics' "epochs": a resumed run starts from it, so that its metrics list the epochs trained before
    the stop too; None (a caller that keeps no records) saves `[]`.

    `extra` holds state holders (objects with a state_dict, e.g. scaler=GradScaler: their state_dict is saved) and
    plain values (sampler_epoch=3). The file also holds its format version (CHECKPOINT_FORMAT) and what made it
    (`checkpoint_origin(args, ...)`), which `load_checkpoint` checks. Written atomically: a temporary file, then a
    rename (`atomic_write`), so a kill during the write leaves the previous checkpoint whole (tests/test_faults.py
    kills a writer); temporary files that killed writers left behind are removed. Pass the bare model (`model.module`
    for DP / DDP).

    A write that fails (disk full, I/O error: `WriteFailed`) removes its temporary file, leaves the previous
    checkpoint as it was, prints one line on stderr naming the file and the OS error, and returns False: the run goes
    on, so that its numbers are not lost, and `Preemption.exit` ends it with status 1. Returns True once written.
    """
    path = Path(path)
    holders = {name: value for name, value in extra.items() if hasattr(value, "state_dict")}
    state = {
        "format": CHECKPOINT_FORMAT,
        "made_by": checkpoint_origin(args, optimizer, **holders),
        "model": model if isinstance(model, dict) else model.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "epoch": epoch,
        "step": step,
        "epochs": [] if epochs is None else epochs,
        **{name: value.state_dict() if name in holders else value for name, value in extra.items()},
    }
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        pid = stale.name.split(".")[-2]
        if pid.isdigit() and not _alive(int(pid)):  # left by a writer killed mid-write
            stale.unlink(missing_ok=True)
    try:
        atomic_write(path, lambda f: torch.save(state, f))
    except WriteFailed as error:
        RUN["failed_writes"].append(str(error))
        print(
            f"{Path(sys.argv[0]).name}: error: {error}; the previous checkpoint is left as it was, training goes on "
            "and the run will exit 1",
            file=sys.stderr,
            flush=True,
        )
        return False
    RUN["saved"] = (path, step)
    return True


def _check_shapes(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """Raise ValueError unless every tensor of the optimizer state `saved` (AdamW's moments...) has the shape of the
    parameter it will belong to: `load_state_dict` checks how many parameters each group has, not their shapes, so
    a state of another model or cut with as many parameters would load and fail at the first step, in a traceback."""
    indices = [index for group in saved["param_groups"] for index in group["params"]]
    params = [param for group in optimizer.param_groups for param in group["params"]]
    for index, param in zip(indices, params):  # a count that differs: load_state_dict says so
        for name, value in saved["state"].get(index, {}).items():
            if torch.is_tensor(value) and value.dim() and value.shape != param.shape:
                raise ValueError(f"{name} of shape {tuple(value.shape)} for a parameter of shape {tuple(param.shape)}")


def load_checkpoint(
    path: Path,
    args: argparse.Namespace,
    model: nn.Module | None,
    optimizer: torch.optim.Optimizer | None = None,
    device: torch.device | str = "cpu",
    **holders,
) -> dict:
    """Load a `save_checkpoint` file into `model`, `optimizer` and the state `holders` (scaler=GradScaler...); return
    the whole dict (epoch, step, plain extras). With `model` None, it only checks the file and returns it (FSDP loads
    its sharded state itself). The dict always has "epochs", the records (`epoch_record` dicts) of the epochs finished
    before the save, which the resumed run goes on appending to: `[]` in a file saved without them (a file older than
    the records, or a caller that keeps none), so that a script can always read `state["epochs"]`.

    Checks before loading anything: the format version, then that the file was made by a run like this one (every
    CHECKPOINT_MATCH key of `checkpoint_origin`: same script, model, data, subset, seed, world size, batch per
    process, accumulation steps, optimizer and extra state, schedule, stage cut), so a resume never trains from a
    partially loaded or silently different state, nor skips other samples than the ones its epoch already trained
    on. Exits with one line (exit 2) that names the file, what it was saved from and what this run asked for, or why
    it is unreadable (not a checkpoint, truncated, or a pickle with code in it: loaded with weights_only=True), or
    what in it does not fit the model or optimizer (an optimizer state's shapes are checked too).
    """
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError) as error:
        die(f"--resume: {path} is not a readable checkpoint ({first_line(error)}); use a new --checkpoint-dir")
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        found = state.get("format", "none") if isinstance(state, dict) else "not a checkpoint dict"
        die(
            f"--resume: {path} has checkpoint format {found}, this code reads format {CHECKPOINT_FORMAT}; "
            "use a new --checkpoint-dir"
        )
    holders = {name: holder for name, holder in holders.items() if holder is not None}  # (train_fast.py's cnn: no Muon)
    saved = state.get("made_by") if isinstance(state.get("made_by"), dict) else {}
    here = checkpoint_origin(args, optimizer, **holders)
    differ = [
        f"{label} {_shown(saved.get(key))} there, {_shown(here[key])} here"
        for key, label in CHECKPOINT_MATCH.items()
        if saved.get(key) != here[key]
    ]
    if differ:
        die(
            f"--resume: {path} was saved by another kind of run ({'; '.join(differ)}); resume with the script and "
            "flags that saved it, or use a new --checkpoint-dir"
        )
    try:
        if model is not None:
            model.load_state_dict(state["model"])
        if optimizer is not None:
            _check_shapes(optimizer, state["optimizer"])
            optimizer.load_state_dict(state["optimizer"])
        for name, holder in holders.items():
            holder.load_state_dict(state[name])
    except (KeyError, IndexError, AttributeError, TypeError, ValueError, RuntimeError) as error:
        die(f"--resume: {path} does not fit this model and optimizer ({first_line(error)}); use a new --checkpoint-dir")
    state.setdefault("epochs", [])  # a file saved without the records: the epochs before it left none
    RUN["saved"] = (Path(path), state["step"])  # what the file on disk holds, until the next save
    return state


def load_part(path: Path, holder, state: dict, *keys) -> None:
    """Load `state[keys[0]][keys[1]]...`, a part of the checkpoint `path` that `load_checkpoint` returned and checked
    (one pipeline stage's optimizer state: `"stage_optimizers", rank`), into `holder` (anything with a
    load_state_dict), or exit in load_checkpoint's one line (exit 2) when the part is missing or does not fit it (a
    damaged file, another model or cut): never a traceback."""
    try:
        part = state
        for key in keys:
            part = part[key]
        if isinstance(holder, torch.optim.Optimizer):
            _check_shapes(holder, part)
        holder.load_state_dict(part)
    except (KeyError, IndexError, AttributeError, TypeError, ValueError, RuntimeError) as error:
        die(f"--resume: {path} does not fit this model and optimizer ({first_line(error)}); use a new --checkpoint-dir")


def exit_if_finished(checkpoint: Path, step: int, total_steps: int, master: bool | None = None) -> None:
    """After `--resume`: if the checkpoint's global `step` already reaches this run's `total_steps`, the run is
    finished: the process whose `master` is True says so in one line (default: rank 0 of the process group, or the
    only process; under torchrun every rank calls this), every process leaves its process group and exits with
    status 0, so that re-running a finished job, e.g. a requeued one, is harmless. Otherwise it returns. Raises
    SystemExit(0) when finished."""
    if step < total_steps:
        return
    if master is None:  # as Preemption's default
        master = not in_process_group() or dist.get_rank() == 0
    if master:
        print(f"{checkpoint} holds a finished run ({step} of {total_steps} steps): nothing left to train", flush=True)
    if in_process_group():
        dist.destroy_process_group()
    raise SystemExit(0)

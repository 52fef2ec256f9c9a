"""What the scripts that run under torchrun without teaching it share: train_DDP.py's set-up in one function (as
pytorch/examples' `ddp_setup()`), and the whole state of a model sharded over the ranks, gathered and written by
rank 0 and read back into the shards (as torchtitan's checkpointer). train_DDP.py keeps its set-up in the script:
it is that lesson; FSDP's sharded save (torch.distributed.checkpoint) stays in train_FSDP.py, its lesson."""

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from .checkpoint import save_checkpoint
from .env import in_process_group, require_torch
from .errors import die, first_line, one_line
from .runstate import RunState


def setup(device: torch.device, nproc: int = 2, min_world_size: int = 1) -> tuple[torch.device, int, int]:
    """train_DDP.py's torchrun set-up: LOCAL_RANK, RANK and WORLD_SIZE from torchrun's environment; on CUDA this
    process's GPU (cuda:LOCAL_RANK, made current before the process group so that NCCL binds it), on a CPU this
    process's share of the cores (cores / LOCAL_WORLD_SIZE threads); then the default process group, nccl on CUDA
    and gloo on a CPU, which meets the others through MASTER_ADDR / MASTER_PORT. Returns (device, rank, world_size).
    One line on stderr and exit 2 (errors.die) when torch is older than 2.15 (the DTensor, FSDP2 and pipelining
    APIs its callers use were tested there), when torchrun did not start this process (it suggests this command
    line under `torchrun --nproc-per-node NPROC`), when it started fewer than `min_world_size` processes, or when
    LOCAL_RANK has no GPU."""
    script = os.path.basename(sys.argv[0])
    require_torch("2.15", f"{script} (DTensor, FSDP2 and pipelining on gloo)")
    if "LOCAL_RANK" not in os.environ:
        die(f"launch with torchrun, e.g. `torchrun --nproc-per-node {nproc} {shlex.join(sys.argv)}`")
    local_rank, rank, world_size = int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world_size < min_world_size:
        die(f"{script} runs in {min_world_size} or more processes: --nproc-per-node {min_world_size} or more")
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            die(f"local rank {local_rank} has no GPU: {torch.cuda.device_count()} visible; lower --nproc-per-node")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, os.cpu_count() // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device, rank, world_size


def sum_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` (any shape, an integer or floating dtype, on any device) summed element by element over the ranks of
    the default process group: a new CPU tensor of its shape and dtype, all-reduced there (so gloo sums a CUDA
    tensor's values too); `tensor` itself, unchanged, where no process group is initialised. Every rank of the group
    must call it."""
    if not in_process_group():
        return tensor
    total = tensor.detach().to("cpu", copy=True)  # a copy even on a CPU: `tensor` is left as it was
    dist.all_reduce(total)
    return total


def require_same_count(count: int, device: torch.device, what: str) -> None:
    """Every rank must run as many of something collective (`count` of them on this rank, e.g. test batches under
    FSDP, whose forward all-gathers: a rank with one more would wait forever for the others). Compares the ranks'
    counts (one all-reduce on `device`: CUDA under nccl); unequal: one line on stderr naming `what` and exit 2 on
    every rank (errors.die), not a hang. Every rank must call it."""
    counts = torch.tensor([count, -count], device=device)
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    most, fewest = counts[0].item(), -counts[1].item()
    if most != fewest:
        die(f"the ranks make {fewest}-{most} {what}: every rank must run as many")


def save_full_state(
    checkpoint: Path, args: argparse.Namespace, model: torch.nn.Module, optimizer, epochs_done: int, step: int,
    epochs: list[dict] | None = None, **extra,
) -> bool:  # fmt: skip
    """Write `checkpoint` (last.pt) as train.py writes it, from a model whose parameters are DTensors sharded over
    the ranks (FSDP2's fully_shard, tensor parallelism): every rank must call it (the shards are all-gathered onto
    rank 0's host memory, `full_state_dict=True, cpu_offload=True`), rank 0 writes. "model" holds whole float32
    tensors under train.py's keys, so train.py's model loads it; with an `optimizer`, "full_optimizer" holds its
    state keyed by parameter name (load_full_state reads it back). `epochs` (rank 0's per-epoch records) and `extra`
    go into the file as save_checkpoint writes them. Returns what save_checkpoint returns on rank 0 (whether the file
    was written), False on the other ranks. The same as `write_full_state(..., gather_full_state(model, optimizer),
    ...)`, for a write that must wait (an async save)."""
    return write_full_state(checkpoint, args, gather_full_state(model, optimizer), epochs_done, step, epochs, **extra)


def gather_full_state(model: torch.nn.Module, optimizer=None) -> dict | None:
    """The whole tensors of a sharded `model` (and `optimizer`) in rank 0's host memory: {"model": state dict under
    train.py's keys[, "full_optimizer": keyed by parameter name]} on rank 0, None on the others. Every rank must call
    it (all-gathers)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    if optimizer is None:
        gathered = {"model": get_model_state_dict(model, options=options)}
    else:
        model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
        gathered = {"model": model_state, "full_optimizer": optimizer_state}
    return gathered if dist.get_rank() == 0 else None


def write_full_state(
    checkpoint: Path, args: argparse.Namespace, gathered: dict | None, epochs_done: int, step: int,
    epochs: list[dict] | None = None, **extra,
) -> bool:  # fmt: skip
    """Rank 0 writes what `gather_full_state` gave it to `checkpoint`, with the per-epoch records `epochs` (None:
    none kept, `[]` saved) and `extra` (save_checkpoint: atomic, a failed write one line and False); the other ranks
    (`gathered` None) write nothing and return False."""
    if gathered is None:
        return False
    state = dict(gathered)
    return save_checkpoint(checkpoint, args, state.pop("model"), None, epochs_done, step, epochs, **state, **extra)


def _root_cause(error: BaseException, folder: Path) -> str:
    """What a failed sharded save says in one line. DCP gathers each rank's exception (CheckpointException.failures:
    rank -> (the exception, its traceback)): the first rank's; its OS error (strerror) where its chain holds one (a
    read-only or vanished folder); torch's zip writer reports a full disk as a RuntimeError ("unexpected pos 704 vs
    598"), so where the chain holds no OS error and the folder's filesystem has less than 1 MiB free, that is said."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        error = first[0] if isinstance(first, tuple) and isinstance(first[0], BaseException) else error
    seen, cause = set(), error
    while cause is not None and id(cause) not in seen:  # an OSError anywhere in the chain names the real reason
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    try:
        free = shutil.disk_usage(next(p for p in (folder, *folder.parents) if p.exists())).free
    except OSError:
        free = None
    if free is not None and free < 1 << 20:
        return f"No space left on device: {free // 1024} KiB free; the writer said: {first_line(error)}"
    return first_line(error)


def sharded_save_failed(folder: Path, error: BaseException, run: RunState) -> None:
    """After a sharded save (dcp.save, or async_save's future) raised on every rank: DCP gathers each rank's failure
    (a full disk, a read-only or vanished folder) and raises it on all, so every rank calls this. Rank 0 removes the
    half-written `folder` (no last.pt names it: last.pt is written only after a save that finished) and prints one
    line on stderr: the folder, the error, and the checkpoint kept (the last one written, `run.saved` of the run's
    RunState: which --resume continues from; or none); every rank leaves the process group and exits 1. Never
    returns."""
    master = not in_process_group() or dist.get_rank() == 0
    if master:
        reason = _root_cause(error, Path(folder))  # (before the folder goes: its disk's free space)
        shutil.rmtree(folder, ignore_errors=True)
        saved = run.saved
        kept = f"{saved[0]} (step {saved[1]}) is kept: --resume continues from it" if saved else "none was saved before"
        message = f"cannot write {folder} ({reason}); the half-written folder is removed, {kept}"
        print(one_line(f"{Path(sys.argv[0]).name}: error: {message}; training stopped"), file=sys.stderr, flush=True)
    if in_process_group():
        dist.destroy_process_group()
    raise SystemExit(1)


def load_full_state(state: dict, model: torch.nn.Module, optimizer, lr: float, total_steps: int) -> None:
    """Load a file that save_full_state wrote (`state`, already read and checked by load_checkpoint) into a sharded
    `model` and its `optimizer`: every rank reads the whole tensors and keeps its shards of them. A one-cycle
    schedule of `lr` over `total_steps` is built and dropped first, so that the param groups have the keys
    (initial_lr, max_lr ...) the saved ones have, as on a fresh start."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=total_steps)
    options = StateDictOptions(full_state_dict=True)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["full_optimizer"], options=options
    )


def sync_stages(stage_blocks: list[list[torch.nn.Module]], owner: list[int]) -> None:
    """Pipeline stages of one model that every rank built (`stage_blocks[s]`: stage s's blocks, in the model's
    order), stage s trained by rank `owner[s]`: every rank but the last stage's sends its stages' weights and
    buffers to that rank, which receives them in place, so that it holds the whole model, trained (to evaluate it or
    to write it). Point to point: the other ranks' copies of a stage they do not train may be freed (meta). Every
    rank must call it."""
    me, to = dist.get_rank(), owner[-1]
    for blocks, rank in zip(stage_blocks, owner):
        if rank != to and me in (rank, to):
            for block in blocks:
                for tensor in block.state_dict().values():  # they share storage with the block's own tensors
                    dist.send(tensor, dst=to) if me == rank else dist.recv(tensor, src=rank)


def save_stages(
    checkpoint: Path, args: argparse.Namespace, model: torch.nn.Module, optimizer, epochs_done: int, step: int,
    epochs: list[dict], stage_blocks: list[list[torch.nn.Module]], owner: list[int],
) -> bool:  # fmt: skip
    """last.pt of a pipeline (see sync_stages for `stage_blocks` and `owner`): the whole `model` as train.py saves
    it, which train.py's model loads, the per-epoch records `epochs` (the writing rank's: the last stage's, which
    evaluates), and "stage_optimizers", each rank's optimizer state (over its stages' parameters) by rank
    (checkpoint.load_part reads a rank's back); the last stage's rank writes it. Every rank must call it. Returns what
    save_checkpoint returns on that rank (whether the file was written), False on the others."""
    sync_stages(stage_blocks, owner)
    stage_optimizers = [None] * dist.get_world_size()
    dist.all_gather_object(stage_optimizers, optimizer.state_dict())
    if dist.get_rank() != owner[-1]:
        return False
    return save_checkpoint(checkpoint, args, model, None, epochs_done, step, epochs, stage_optimizers=stage_optimizers)

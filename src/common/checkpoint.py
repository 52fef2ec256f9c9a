"""Checkpoints: what a resume must share with the run that saved it, saved atomically with a digest of their bytes,
refused in one line."""

from __future__ import annotations

import argparse
import atexit
import fcntl
import hashlib
import os
import re
import shlex
import socket
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

from .env import in_process_group
from .errors import die, first_line, one_line
from .models import TEXT_MODELS
from .io import WriteFailed, atomic_write, atomic_write_text

# 1: the files before 2026-11-23 (no version, no made_by); 2: + format, made_by, state holders; 3: + subset, seed,
# accumulation steps in made_by; 4: + epochs, max steps, peak learning rate (and, from 2026-11-28 on, the digest
# beside the file); 5: the same contents, and the digest always: one missing is refused as a changed file is
CHECKPOINT_FORMAT = 5
READABLE_FORMATS = (4, 5)  # 4's files load too: their contents are 5's; without a digest, with a line saying so
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


# -- digests: a checkpoint's sha256, written before it, checked before anything of it is loaded --------------------
# torch's zip reader does not check the CRCs its archive carries: a bit flipped on disk or in a copy loads silently.
# So every file a resume reads has its sha256 beside it: last.pt's in last.pt.sha256 (`digest_path`), each file of a
# DCP folder (train_FSDP.py's `sharded-stepN/`) in that folder's digests.sha256, whose own sha256 last.pt holds
# ("sharded_sha256"). Both are in `sha256sum` format: `sha256sum -c last.pt.sha256` checks by hand.
FOLDER_DIGESTS = "digests.sha256"  # in a DCP folder: every file's sha256, written once its save has finished
_DIGEST_LINE = re.compile(r"([0-9a-f]{64})  (\S[^\n]*)")  # "HEX  NAME", as sha256sum writes it
_MAX_DIGEST_FILE = 1 << 20  # bytes: a digest list is a few lines; more is not one


class BadDigests(ValueError):
    """A digest file (last.pt.sha256, a folder's digests.sha256) that cannot be read or is not `sha256sum` lines."""


class _Hashing:
    """A binary file object's `write` and `flush` that also feed a sha256: the digest of exactly the bytes written
    (torch.save writes a file object sequentially)."""

    def __init__(self, f):
        self.f, self.sha256 = f, hashlib.sha256()

    def write(self, data) -> int:
        self.sha256.update(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def _sha256_of(f) -> str:
    """The hex sha256 of what remains of the binary file object `f`, read in 1 MiB chunks."""
    sha256 = hashlib.sha256()
    for chunk in iter(lambda: f.read(1 << 20), b""):
        sha256.update(chunk)
    return sha256.hexdigest()


def file_sha256(path: Path) -> str:
    """The hex sha256 of the file `path` (64 characters), streamed. Raises OSError when it cannot be read."""
    with open(path, "rb") as f:
        return _sha256_of(f)


def digest_path(path: Path) -> Path:
    """Where the sha256 of the checkpoint `path` is kept: beside it, `path` + ".sha256" (ck/last.pt.sha256)."""
    path = Path(path)
    return path.with_name(path.name + ".sha256")


def read_digests(path: Path) -> list[tuple[str, str]] | None:
    """The (hex sha256, name) lines of the digest file `path` (`sha256sum` format), in order; None when there is no
    such file. Raises BadDigests (its message: why) when it cannot be read, is larger than 1 MiB, is not UTF-8, has a
    line of another form, or lists nothing."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_DIGEST_FILE + 1)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise BadDigests(f"cannot be read: {error.strerror or first_line(error)}") from None
    if len(raw) > _MAX_DIGEST_FILE:
        raise BadDigests("larger than a list of digests")
    try:
        lines = raw.decode().splitlines()
    except UnicodeDecodeError:
        raise BadDigests("not text") from None
    entries = []
    for number, line in enumerate(lines, 1):
        match = _DIGEST_LINE.fullmatch(line)
        if match is None:
            raise BadDigests(f"line {number} is not `SHA256  NAME`")
        entries.append((match[1], match[2]))
    if not entries:
        raise BadDigests("it lists no digest")
    return entries


def _digest_text(digests: list[str], name: str) -> str:
    return "".join(f"{digest}  {name}\n" for digest in digests)


def seal_folder(folder: Path) -> str:
    """Write `folder/digests.sha256` (atomically): the sha256 of every file under `folder` (a finished DCP save:
    .metadata and every rank's .distcp files), by path relative to it, sorted; return the sha256 of that list, which
    last.pt keeps ("sharded_sha256") so that the list itself is checked too. Reads every byte of the folder (rank 0,
    after the collective save returned: every rank's files are on disk). Raises FileNotFoundError when `folder` is not
    a folder, WriteFailed when the list cannot be written."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such checkpoint folder to list")
    files = sorted(
        path for path in folder.rglob("*")
        if path.is_file() and path.name != FOLDER_DIGESTS and not path.name.startswith(f".{FOLDER_DIGESTS}.")
    )  # fmt: skip
    text = "".join(f"{file_sha256(path)}  {path.relative_to(folder).as_posix()}\n" for path in files)
    atomic_write_text(folder / FOLDER_DIGESTS, text)
    return hashlib.sha256(text.encode()).hexdigest()


def _refuse_changed(file: Path, where: str) -> None:
    die(
        f"--resume: {file} changed after it was written (its sha256 is not the one {where}): a damaged copy, a disk "
        "error or another file; use a new --checkpoint-dir or the file's original copy"
    )


def check_folder(path: Path, state: dict) -> None:
    """Check the DCP folder that the checkpoint `path` (already checked and loaded as `state`) names in
    `state["sharded"]`, before dcp.load reads it: its digests.sha256 has the sha256 last.pt holds, and every file it
    lists is there with its sha256. Exits with one line (exit 2) naming the file that is missing or changed; a
    checkpoint saved before folders carried digests (no "sharded_sha256") loads with one line on stdout saying that
    its folder could not be checked. Reads every byte of the folder."""
    name = state.get("sharded")
    if not isinstance(name, str) or not name:
        die(f"--resume: {path} names no sharded checkpoint folder ({name!r}); use a new --checkpoint-dir")
    folder = Path(path).parent / name
    expected = state.get("sharded_sha256")
    if expected is None:
        print(f"{folder} carries no digests (saved before checkpoints did): its files could not be checked", flush=True)
        return
    listing = folder / FOLDER_DIGESTS
    try:
        with open(listing, "rb") as f:
            raw = f.read(_MAX_DIGEST_FILE + 1)
    except OSError as error:
        die(
            f"--resume: {listing} cannot be read ({error.strerror or first_line(error)}), and {path} names that "
            "folder; restore the folder's original copy or use a new --checkpoint-dir"
        )
    if hashlib.sha256(raw).hexdigest() != expected:
        _refuse_changed(listing, f"{path} holds")
    try:
        entries = read_digests(listing)
    except BadDigests as error:  # its sha256 matched: only a bug writes such a list
        die(f"--resume: {listing} is not a list of digests ({error}); use a new --checkpoint-dir")
    for digest, relative in entries:
        file = folder / relative
        try:
            actual = file_sha256(file)
        except OSError as error:
            die(
                f"--resume: {file} cannot be read ({error.strerror or first_line(error)}), and {listing} lists it; "
                "restore the folder's original copy or use a new --checkpoint-dir"
            )
        if actual != digest:
            _refuse_changed(file, f"in {listing}")


def _alive(pid: int) -> bool:
    """Whether process `pid` exists (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


# -- the lock: one run owns its --checkpoint-dir ------------------------------------------------------------------
# Two runs on one folder (a command line repeated from the shell's history) would overwrite each other's last.pt and
# digests. The folder's lock file holds a POSIX record lock (fcntl.lockf) for the whole run: the kernel drops it when
# the process ends, however it ends (SIGKILL included), so a lock whose run is gone is free; and, unlike flock, a
# forked child (a DataLoader worker) does not inherit it, so a worker left behind for a moment cannot keep it. The
# file's text names the run that holds it (PID, host, start, command) for the refusal's line. A run that ends cleanly
# removes the file, so a file found with a free lock is a killed run's: taken over, and said.
LOCK_FILE = ".lock"
_HELD: dict = {}  # this process's lock file, kept open while it runs (closing it would drop the lock)


def lock_checkpoint_dir(folder: Path) -> None:
    """Take `folder`'s lock (`folder/.lock`) for the rest of this process, or exit with one line (exit 2) that names
    the run holding it: its PID, host, start and command. Where the lock is free but its file names a run (killed
    before it could remove it), it is taken over with one line on stdout naming that run. Call it once per run, in
    the process that writes last.pt (rank 0 under torchrun; the other ranks stand behind it). The lock lasts until the
    process ends; at a normal exit its file is removed. Exits with one line when the lock file cannot be opened."""
    folder = Path(folder)
    path = folder / LOCK_FILE
    while True:
        try:
            f = os.fdopen(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), "r+", encoding="utf-8", errors="replace")
        except OSError as error:
            die(f"--checkpoint-dir {folder}: its lock file {LOCK_FILE} cannot be opened ({error.strerror or error})")
        try:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # EAGAIN / EACCES: another process holds it
            f.seek(0)
            holder = one_line(f.read(1000).strip()) or "a run that has not written its name yet"
            f.close()
            die(
                f"--checkpoint-dir {folder} is in use by another run ({holder}): one run writes a folder's "
                "checkpoints; wait for it to end, stop it, or pick another --checkpoint-dir"
            )
        try:  # the file this lock is on is still the folder's (a run ending now removes it): else lock the new one
            if os.stat(path).st_ino == os.fstat(f.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        f.close()
    f.seek(0)
    previous = one_line(f.read(1000).strip())
    if previous:
        print(one_line(f"--checkpoint-dir {folder}: took over the lock of a run that is gone ({previous})"), flush=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    try:  # the holder's name, for a refusal's line; the lock holds without it (a full disk)
        f.seek(0)
        f.truncate()
        holder = f"PID {os.getpid()} on {socket.gethostname()}, since {started}: {shlex.join(sys.argv)}"
        f.write(one_line(holder) + "\n")
        f.flush()
    except OSError:
        pass
    _HELD.update(file=f, path=path, pid=os.getpid())
    atexit.register(_release_lock)


def _release_lock() -> None:
    """atexit: remove the lock file of the run that holds it, then drop the lock (not in a forked child, which never
    held it)."""
    f = _HELD.get("file")
    if f is None or _HELD.get("pid") != os.getpid():
        return
    try:
        _HELD["path"].unlink(missing_ok=True)  # while locked: a run that opened it meanwhile finds it gone, retries
        f.close()
    except (OSError, ValueError):
        pass
    _HELD.clear()


def _shown(value) -> str:
    """A made_by value in a message: lists joined by commas, empty ones and None as "none"; one line of at most 160
    characters (a damaged file's value may be anything, a tensor's repr of many lines)."""
    if isinstance(value, list):
        text = ", ".join(map(str, value)) or "none"
    else:
        text = "none" if value is None else str(value)
    return " ".join(text.split())[:160]


def _same(saved, here) -> bool:
    """Whether a made_by value of the file equals this run's: False where the comparison itself fails (a tensor or
    another object that a damaged file of the time before digests may hold)."""
    try:
        return bool(saved == here)
    except Exception:
        return False


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

    The file's sha256 goes beside it, in `path` + ".sha256" (`digest_path`), which `load_checkpoint` checks before it
    loads anything. Computed over the bytes as they are written, then, before the rename, the digest list is written
    (atomically) with the new digest first and the ones it held before after it (the file still in place until the
    rename); once the file is renamed, the list is rewritten with its digest alone. So a process killed at any moment
    leaves a last.pt whose digest is listed: the old file, listed until the new one is in place, or the new one. With
    `sharded="sharded-stepN"` (train_FSDP.py's: the DCP folder beside `path` that this save completes), the folder's
    files are listed first (`seal_folder`: its digests.sha256) and the list's sha256 goes into the file
    ("sharded_sha256"), so that a resume checks the shards too; the folder is named in last.pt only after that.

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
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # (the digest list's too: .last.pt.sha256.PID.tmp)
        pid = stale.name.split(".")[-2]
        if pid.isdigit() and not _alive(int(pid)):  # left by a writer killed mid-write
            stale.unlink(missing_ok=True)
    listing = digest_path(path)
    try:
        before = listing.read_bytes()  # put back as it was if the new file cannot be written
    except OSError:
        before = None
    try:
        listed = read_digests(listing)
    except BadDigests:
        listed = []  # a damaged list vouches for nothing: the file in place stays unlisted
    previous = [digest for digest, _ in listed] if listed is not None else []
    if listed is None and path.is_file():  # a file from before the digests: listed until the new one is in place
        try:
            previous = [file_sha256(path)]
        except OSError:
            pass
    hashing, listed_new = None, False

    def write(f) -> None:
        nonlocal hashing
        hashing = _Hashing(f)
        torch.save(state, hashing)

    def list_both() -> None:  # on disk before the rename: whichever file a kill leaves in place is listed
        nonlocal listed_new
        new = hashing.sha256.hexdigest()
        atomic_write_text(listing, _digest_text([new, *(d for d in previous if d != new)], path.name))
        listed_new = True

    try:
        if isinstance(extra.get("sharded"), str):  # a DCP save has finished: its files' digests before its name
            state["sharded_sha256"] = seal_folder(path.parent / extra["sharded"])
        atomic_write(path, write, before_replace=list_both)
    except WriteFailed as error:
        if listed_new:  # the list as it was (the one written lists the old file too: this is only tidier)
            try:
                if before is None:
                    listing.unlink(missing_ok=True)
                else:
                    atomic_write(listing, lambda f: f.write(before))
            except OSError:
                pass
        args.run.failed_writes.append(str(error))
        print(
            one_line(
                f"{Path(sys.argv[0]).name}: error: {error}; the previous checkpoint is left as it was, training goes "
                "on and the run will exit 1"
            ),
            file=sys.stderr,
            flush=True,
        )
        return False
    try:
        atomic_write_text(listing, _digest_text([hashing.sha256.hexdigest()], path.name))  # the file's digest alone
    except WriteFailed:
        pass  # the list written before the rename holds it too
    args.run.saved = (path, step)
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

    Checks before loading anything: the file's sha256 against the list saved beside it (`digest_path`; a file changed
    after it was written is refused in one line naming it), the format version (READABLE_FORMATS), that a file
    without its list is one that may predate the digests (format 4, no DCP folder's digests in it: it loads with one
    line on stdout saying it could not be checked; any other is refused like a changed file), then that it was made by a
    run like this one (every CHECKPOINT_MATCH key of `checkpoint_origin`: same script, model, data, subset, seed,
    world size, batch per process, accumulation steps, optimizer and extra state, schedule, stage cut), so a resume
    never trains from a partially loaded or silently different state, nor skips other samples than the ones its
    epoch already trained on. Exits with one line (exit 2) that names the file, what it was saved from and what this
    run asked for, or why it is unreadable (not a checkpoint, truncated, or a pickle with code in it: loaded with
    weights_only=True; any exception torch.load raises on its bytes), or what in it does not fit the model or
    optimizer (an optimizer state's shapes are checked too), or that it holds no run's progress. A file that names a
    DCP folder (`state["sharded"]`) has that folder checked too (`check_folder`: every file's sha256) before it
    returns, so before the script's dcp.load.
    """
    path = Path(path)
    listing = digest_path(path)
    try:
        listed = read_digests(listing)
    except BadDigests as error:
        die(
            f"--resume: {listing}, the sha256 of {path} saved beside it, is damaged ({error}); use a new "
            "--checkpoint-dir or the files' original copies"
        )
    try:
        with open(path, "rb") as f:
            if listed is not None and _sha256_of(f) not in [digest for digest, _ in listed]:
                _refuse_changed(path, f"saved beside it in {listing.name}")
            f.seek(0)
            with warnings.catch_warnings():  # ("Detected pickle protocol 122": lines beside the one line)
                warnings.simplefilter("ignore")
                state = torch.load(f, map_location=device, weights_only=True)
    except Exception as error:  # any bytes: torch.load raises IndexError, KeyError ... as well as its own errors
        die(f"--resume: {path} is not a readable checkpoint ({first_line(error)}); use a new --checkpoint-dir")
    if not isinstance(state, dict) or state.get("format") not in READABLE_FORMATS:
        found = _shown(state.get("format", "none")) if isinstance(state, dict) else "not a checkpoint dict"
        die(
            f"--resume: {path} has checkpoint format {found}, this code reads formats "
            f"{', '.join(map(str, READABLE_FORMATS))}; use a new --checkpoint-dir"
        )
    if listed is None:  # no digest: only a file of format 4 without a DCP folder's may predate the digests
        if state["format"] == 4 and "sharded_sha256" not in state:
            print(f"{path} has no {listing.name} beside it: a checkpoint of format 4 (written before 2026-11-29) may "
                  "predate the digests, so it loads, its bytes unchecked", flush=True)  # fmt: skip
        else:
            why = "it names its shards' digests" if "sharded_sha256" in state else f"format {state['format']}"
            die(
                f"--resume: {path} has no {listing.name} beside it, and a checkpoint such as this one ({why}) is "
                "always saved with one: refused, as a changed file is; restore the pair from the original copy, or "
                "use a new --checkpoint-dir"
            )
    holders = {name: holder for name, holder in holders.items() if holder is not None}  # (train_fast.py's cnn: no Muon)
    saved = state.get("made_by") if isinstance(state.get("made_by"), dict) else {}
    here = checkpoint_origin(args, optimizer, **holders)
    differ = [
        f"{label} {_shown(saved.get(key))} there, {_shown(here[key])} here"
        for key, label in CHECKPOINT_MATCH.items()
        if not _same(saved.get(key), here[key])
    ]
    if differ:
        die(
            f"--resume: {path} was saved by another kind of run ({'; '.join(differ)}); resume with the script and "
            "flags that saved it, or use a new --checkpoint-dir"
        )
    counts = {key: state.get(key) for key in ("epoch", "step")}  # what the scripts read of it, before anything loads
    whole = all(type(value) is int and value >= 0 for value in counts.values())
    if not whole or not isinstance(state.get("epochs", []), list):
        die(f"--resume: {path} does not hold a run's progress ({_shown(counts)}); use a new --checkpoint-dir")
    if "sharded" in state:  # a DCP folder (train_FSDP.py): checked whole before dcp.load reads any of it
        check_folder(path, state)
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
    args.run.saved = (Path(path), state["step"])  # what the file on disk holds, until the next save
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

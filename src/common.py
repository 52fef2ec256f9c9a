"""What every training script shares, and nothing that belongs to one technique.

The scripts (`train.py`, `train_*.py`, `loader*.py`) keep their training loop in the file, so that a diff shows a
technique in context; this module holds the parts they use unchanged, in the order train.py uses them: the flags,
seeding and device pick, Fashion-MNIST and synthetic data, the model factory, evaluation, the meter (images/s, step
time, data-wait, memory), the per-epoch records, the closing report with the metrics JSON and its provenance, the
checkpoint helpers, the ImageFolder helpers of the loaders, and the one-line errors. No function here asks which
technique calls it. Importing it changes nothing global: `parse_args()`, which only the scripts call, installs the
excepthook that turns the failures a user causes into one line on stderr.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import json
import os
import pickle
import platform
import random
import resource
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

REPO = Path(__file__).resolve().parent.parent
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")  # Debian package `dataset-fashion-mnist`
FASHION_MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}
GIB = 1024**3
# The ImageNet statistics (torchvision's models use them): per-channel mean and std of RGB in [0, 1].
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")  # what image_folders looks for (ImageFolder and DALI also read more types)
MODELS = ["cnn", "mlp", "resnet18", "resnet50", "vit"]
# What this process's run did with its checkpoints and signals, for its closing report and its exit status: the
# checkpoint writes that failed (their one-line messages), the last checkpoint written (path, step), and the step a
# SIGTERM stopped the run at (`Preemption`).
RUN = {"failed_writes": [], "saved": None, "stopped_at": None}


# ----------------------------------------------------------------------------------------------------------------
# Command line


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (otherwise one usage error, exit 2)."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a number > 0 (nan refused)."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], e.g. 0.91 for 91 %, got {text}")
    return value


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Each default said once: "(default: X)" after a flag's help unless the help already names its default, or
    there is none to name (None, or off for an on/off flag); the epilog (the script's run lines) kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "default" in text
            or any(action.default is x for x in (None, False, argparse.SUPPRESS))
            or not action.option_strings
        ):
            return text
        return text + " (default: %(default)s)"


def _new_parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser whose description is the docstring's first line and whose --help ends with its run lines."""
    lines = (doc or "").strip().splitlines()
    run_lines = [line for line in lines if line.startswith("    ")]
    return argparse.ArgumentParser(
        description=lines[0] if lines else None,
        epilog="run lines:\n" + "\n".join(run_lines) if run_lines else None,
        formatter_class=_HelpFormatter,
    )


def get_parser(doc: str | None = None, datasets: tuple[str, ...] = ("fashion-mnist", "synthetic")):
    """The flags of the train*.py scripts; a script adds its own with `parser.add_argument` before parsing.

    `doc` is the script's docstring: its first line describes the script in --help, its indented run lines end it.
    `datasets` are the --dataset choices the script supports. Invalid values (a non-positive batch size, an unknown
    model, ...) make argparse print one usage error on stderr and exit with status 2.
    """
    p = _new_parser(doc)
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="folder with the four Fashion-MNIST *-ubyte.gz files (default: data/, then "
        f"{DEBIAN_FASHION_MNIST}, then torchvision's download into data/); with --dataset imagefolder (train_fast.py), "
        "the ImageFolder root",
    )
    p.add_argument(
        "--dataset",
        choices=list(datasets),
        default="fashion-mnist",
        help="synthetic: one random batch already on the device, to measure the compute ceiling",
    )
    p.add_argument(
        "--image-size",
        type=positive_int,
        default=None,
        help="side in pixels of synthetic images, 3 x S x S (default 224), or of the crops of --dataset imagefolder; "
        "Fashion-MNIST is always 1 x 28 x 28",
    )
    p.add_argument(
        "--subset",
        type=positive_int,
        default=None,
        help="train on the first N training images only (synthetic: N images per epoch, default 10240)",
    )
    _training_flags(p)
    p.add_argument(
        "--clip-grad-norm", type=positive_float, default=None, help="clip the gradients' global L2 norm to this"
    )
    return p


def get_image_folder_parser(doc: str | None = None) -> argparse.ArgumentParser:
    """The flags of the loader*.py scripts, which read an ImageFolder of image files (train/ and val/ inside).

    The training flags of `get_parser` (not --dataset, --subset or --clip-grad-norm), with `--data-dir` the ImageFolder root, `--image-size` the crop side,
    `--loader-only` to time the input pipeline alone, and `--amp-dtype` / `--channels-last` so that the end-to-end
    rows can run the model at the compute rate of train_amp.py / train_channels_last.py. Bad values exit 2.
    """
    p = _new_parser(doc)
    p.add_argument(
        "--data-dir",
        type=Path,
        default=REPO / "data" / "fashion-mnist-jpeg",
        help="an ImageFolder root with train/<class>/*.jpg and val/<class>/*.jpg (python bench/prepare_data.py "
        "writes data/fashion-mnist-jpeg and data/imagenet-synthetic)",
    )
    p.add_argument("--image-size", type=positive_int, default=32, help="side in pixels of the square crops")
    p.add_argument("--loader-only", action="store_true", help="iterate the input pipeline without the model")
    p.add_argument(
        "--amp-dtype",
        choices=["float16", "bfloat16"],
        default=None,
        help="autocast the model in this dtype, as train_amp.py does (GradScaler for float16); default: float32",
    )
    p.add_argument("--channels-last", action="store_true", help="NHWC memory format for model and images")
    _training_flags(p)
    return p


def _training_flags(p: argparse.ArgumentParser) -> None:
    """The flags every script shares: model, schedule, batch, workers, seed, device, metrics and checkpoints."""
    p.add_argument("--model", choices=MODELS, default="cnn", help="what to train (see common.build_model)")
    p.add_argument("--epochs", type=positive_int, default=2, help="passes over the training set")
    p.add_argument("--max-steps", type=positive_int, default=None, help="stop after this many optimizer steps")
    p.add_argument("--batch-size", type=positive_int, default=128, help="images per process per step")
    p.add_argument("--lr", type=positive_float, default=5e-3, help="peak learning rate of the one-cycle schedule")
    p.add_argument("--workers", type=non_negative_int, default=2, help="DataLoader worker processes")
    p.add_argument("--seed", type=int, default=0, help="seed of every random number generator")
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="bitwise-reproducible runs for a seed: deterministic algorithms only, no cuDNN autotuning (slower)",
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: cuda when available")
    p.add_argument(
        "--warmup-steps",
        type=non_negative_int,
        default=10,
        help="steps left out of the images/s window (compilation, cuDNN autotuning, worker start)",
    )
    p.add_argument(
        "--target-acc",
        type=_fraction,
        default=None,
        help="report the training seconds until the test accuracy first reaches this fraction",
    )
    p.add_argument("--metrics-out", type=Path, default=None, help="write the run's metrics JSON here")
    p.add_argument("--log-every", type=positive_int, default=50, help="print a progress line every N steps")
    p.add_argument("--checkpoint-dir", type=Path, default=None, help="save last.pt here at the end of every epoch")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint-dir/last.pt if it exists")


def parse_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Parse the command line, check the flags that only make sense together (argparse: usage and exit 2) and the
    outputs (`output_problem`: one line, exit 2), all before any work, and install the one-line error hook
    (`install_error_hook`). A --checkpoint-dir that already holds last.pt needs --resume: a new run would overwrite
    the earlier one's checkpoint."""
    install_error_hook()
    args = parser.parse_args()
    if args.resume and args.checkpoint_dir is None:
        parser.error("--resume needs --checkpoint-dir (the folder that holds last.pt)")
    if getattr(args, "dataset", None) == "fashion-mnist" and args.image_size not in (None, 28):
        parser.error("--image-size applies to --dataset synthetic; Fashion-MNIST images are 28 x 28")
    if args.model == "vit":
        side = 28 if getattr(args, "dataset", None) == "fashion-mnist" else (args.image_size or 224)
        if side % vit_patch_size(side):
            parser.error(
                f"--model vit cuts images into {vit_patch_size(side)} px patches: --image-size {side} is not a multiple"
            )
    # Check the outputs now rather than after hours of training, when a failed write would lose the results.
    for flag, path, is_folder in (
        ("--metrics-out", args.metrics_out, False),
        ("--checkpoint-dir", args.checkpoint_dir, True),
    ):
        problem = output_problem(path, is_folder) if path is not None else None
        if problem:
            die(f"{flag} {path} {problem}")
    if args.checkpoint_dir is not None and not args.resume and (args.checkpoint_dir / "last.pt").exists():
        die(
            f"--checkpoint-dir {args.checkpoint_dir} already holds last.pt from an earlier run: add --resume to "
            "continue it, or pick another folder (this run would overwrite it)"
        )
    return args


def output_problem(path: Path, is_folder: bool = False) -> str | None:
    """Why the file (or, with `is_folder`, the folder) `path` cannot be written, as the end of a sentence that starts
    with the path, or None when it can: "is a folder", "is a file, not a folder", "cannot be created: PARENT is a
    file", "cannot be created / written (Permission denied / Read-only file system...)".

    Creates the missing folders (the folder, or the file's parent) and writes and removes a probe file in it: a real
    write, because os.access says yes to root on a read-only filesystem or in /sys.
    """
    path = Path(path)
    if not is_folder and path.is_dir():
        return f"is a folder; give a file name, e.g. {path / 'metrics.json'}"
    if is_folder and path.exists() and not path.is_dir():
        return "is a file, not a folder"
    folder = path if is_folder else path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        files = [parent for parent in (folder, *folder.parents) if parent.is_file()]  # mkdir through or onto a file
        return f"cannot be created: {files[0]} is a file" if files else f"cannot be created ({error.strerror})"
    try:
        probe = folder / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        return f"cannot be written{' into' if is_folder else ''} ({error.strerror}); pick a folder you can write"
    return None


def input_shape(args: argparse.Namespace) -> tuple[int, int]:
    """(channels, side) of the images `--dataset` gives: Fashion-MNIST 1 x 28 x 28, synthetic 3 x S x S."""
    return (1, 28) if args.dataset == "fashion-mnist" else (3, args.image_size or 224)


def precision_label(device: torch.device) -> str:
    """How an fp32 model really computes: on a CUDA GPU with TF32 (compute capability 8.0 or newer: Ampere, Hopper),
    cuDNN runs convolutions in TF32 unless that is switched off; older GPUs (V100, T4) have no TF32."""
    if device.type == "cuda" and torch.backends.cudnn.allow_tf32 and torch.cuda.get_device_capability(device) >= (8, 0):
        return "fp32 (TF32 convs)"
    return "fp32"


# ----------------------------------------------------------------------------------------------------------------
# Seeding and device


def seed_everything(seed: int, deterministic: bool = False) -> torch.Generator:
    """Seed Python, NumPy and torch (all devices); return a torch.Generator for the DataLoader's shuffling.

    With `deterministic`, also make every kernel reproducible, following
    https://pytorch.org/docs/stable/notes/randomness.html: `torch.use_deterministic_algorithms(True, warn_only=True)`
    (deterministic kernels where torch has them; an op without one warns once naming itself instead of stopping the
    run), cuDNN without autotuning (`benchmark = False`, `deterministic = True`) and the cuBLAS workspace setting
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


def get_device(choice: str = "auto") -> torch.device:
    """`cuda` if asked for or available (with `auto`), else `cpu`. Exits with one line if `cuda` is missing."""
    if choice == "cuda" and not torch.cuda.is_available():
        die("--device cuda was given but torch sees no CUDA GPU (torch.cuda.is_available() is False); use --device cpu")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)


# ----------------------------------------------------------------------------------------------------------------
# Data


class DataNotFound(FileNotFoundError):
    """Raised when no folder holds the four Fashion-MNIST files and the download failed or was not allowed."""


def _has_fashion_mnist(folder: Path) -> bool:
    return all((folder / name).is_file() for name in FASHION_MNIST_FILES.values())


def find_fashion_mnist(data_dir: Path | None = None, search: list[Path] | None = None, download: bool = True) -> Path:
    """Return the folder that holds the four Fashion-MNIST `*-ubyte.gz` files.

    Order: an explicit `data_dir` only (its `FashionMNIST/raw` subfolder counts too); else each of `search` (default:
    `data/`, `data/FashionMNIST/raw` and the Debian package's `/usr/share/datasets/fashion-mnist`); else torchvision's
    download into `data/`. Raises DataNotFound naming the three ways to get the files.
    """
    how = (
        "get Fashion-MNIST one of three ways: `apt-get install dataset-fashion-mnist` (Debian/Ubuntu), "
        "put the four *-ubyte.gz files in data/ (or pass --data-dir), or allow torchvision's download"
    )
    if data_dir is not None:
        for folder in (data_dir, data_dir / "FashionMNIST" / "raw"):
            if _has_fashion_mnist(folder):
                return folder
        if not data_dir.exists():
            raise DataNotFound(f"--data-dir {data_dir} does not exist; {how}")
        raise DataNotFound(
            f"--data-dir {data_dir} lacks the Fashion-MNIST files ({', '.join(FASHION_MNIST_FILES.values())}); {how}"
        )
    if search is None:
        search = [REPO / "data", REPO / "data" / "FashionMNIST" / "raw", DEBIAN_FASHION_MNIST]
    for folder in search:
        if _has_fashion_mnist(folder):
            return folder
    if download:
        import torchvision  # here and in build_model only: its import adds seconds to every script's start-up

        try:
            torchvision.datasets.FashionMNIST(REPO / "data", train=True, download=True)
            torchvision.datasets.FashionMNIST(REPO / "data", train=False, download=True)
        except Exception as error:  # no network, a proxy, a full disk: all end in the same advice
            raise DataNotFound(
                f"no Fashion-MNIST in {', '.join(map(str, search))} and the download failed ({error}); {how}"
            ) from error
        return REPO / "data" / "FashionMNIST" / "raw"
    raise DataNotFound(f"no Fashion-MNIST in {', '.join(map(str, search))}; {how}")


class BadDataFile(ValueError):
    """Raised by `read_idx` / `fashion_mnist` for a data file that is truncated, foreign or inconsistent."""


def read_idx(path: Path) -> np.ndarray:
    """Read a gzipped IDX file (the MNIST format: magic 0x0000 08 NDIM, NDIM big-endian sizes, then uint8 data) into a
    uint8 array of those sizes. Raises BadDataFile naming the file when it is not gzip, is truncated, has another magic
    number or holds a different number of bytes than its header says."""
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as error:
        raise BadDataFile(f"{path} is not a readable gzip file ({error})") from None
    if len(raw) < 4 or raw[:3] != b"\x00\x00\x08" or not 1 <= raw[3] <= 4:
        raise BadDataFile(f"{path} is not an IDX file of bytes (magic {raw[:4].hex() or 'missing'}, expected 000008xx)")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    if len(raw) != 4 + 4 * ndim + int(np.prod(shape)):
        raise BadDataFile(f"{path} holds {len(raw) - 4 - 4 * ndim} bytes of data, its header says {shape}: truncated?")
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def fashion_mnist(folder: Path, subset: int | None = None):
    """Fashion-MNIST as two in-memory `TensorDataset`s of (images, labels).

    images: float32 (N, 1, 28, 28), normalised with the training set's mean and std (computed here, ~0.286 / 0.353);
    labels: int64 (N,). Train has 60,000 images (the first `subset` if given), test always all 10,000.
    Raises BadDataFile when a file is unreadable or the images and labels do not match (sizes, labels 0-9).
    """
    f = {key: folder / name for key, name in FASHION_MNIST_FILES.items()}
    arrays = {key: read_idx(path) for key, path in f.items()}
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.shape != images.shape[:1]:
            raise BadDataFile(
                f"{f[split + '_images']} and its labels are {images.shape} and {labels.shape}, not N x 28 x 28 and N"
            )
        if labels.size and labels.max() >= 10:
            raise BadDataFile(f"{f[split + '_labels']} has label {labels.max()}; Fashion-MNIST's are 0-9")
    train_x = torch.from_numpy(arrays["train_images"].copy()).unsqueeze(1).float().div_(255)
    test_x = torch.from_numpy(arrays["test_images"].copy()).unsqueeze(1).float().div_(255)
    mean, std = train_x.mean(), train_x.std()
    train_y = torch.from_numpy(arrays["train_labels"].astype(np.int64))
    test_y = torch.from_numpy(arrays["test_labels"].astype(np.int64))
    if subset is not None:
        train_x, train_y = train_x[:subset], train_y[:subset]
    return (
        torch.utils.data.TensorDataset((train_x - mean) / std, train_y),
        torch.utils.data.TensorDataset((test_x - mean) / std, test_y),
    )


class SyntheticLoader:
    """Yields the same random batch, already on `device`, `steps` times per pass: the compute ceiling.

    images: float32 (batch_size, channels, image_size, image_size) ~ N(0, 1); labels: int64 (batch_size,) in [0, 10).
    Nothing is decoded or copied per step, so images/s measures the model and the optimizer alone.
    """

    def __init__(self, batch_size: int, image_size: int, steps: int, device: torch.device, channels: int = 3):
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randn(batch_size, channels, image_size, image_size, generator=generator).to(device)
        self.labels = torch.randint(0, 10, (batch_size,), generator=generator).to(device)
        self.steps, self.dataset = steps, range(steps * batch_size)  # `dataset` so len(loader.dataset) works

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        for _ in range(self.steps):
            yield self.images, self.labels


def load_data(args: argparse.Namespace):
    """Return `(train_set, test_set)` for `--dataset fashion-mnist`, after checking they fit `--batch-size`.

    Exits with one line on stderr when the data is missing or the training set is smaller than one batch
    (every epoch drops its last partial batch, so it would run no step). Not for `--dataset synthetic`.
    """
    try:
        folder = find_fashion_mnist(args.data_dir)
    except DataNotFound as error:
        die(str(error))
    try:
        train_set, test_set = fashion_mnist(folder, args.subset)
    except BadDataFile as error:
        die(f"{error}; replace the four Fashion-MNIST files (apt-get install --reinstall dataset-fashion-mnist)")
    if len(train_set) < args.batch_size:
        die(
            f"--batch-size {args.batch_size} is larger than the {len(train_set)} training images; "
            "lower --batch-size or raise --subset"
        )
    return train_set, test_set


def synthetic_data(args: argparse.Namespace, device: torch.device):
    """Return `(train_loader, test_loader)` of SyntheticLoader for `--dataset synthetic` (3 x S x S, S = 224 default).

    An epoch is `--subset` images (default 10,240) rounded down to whole batches; the test loader yields the same
    fixed random batch twice, so its accuracy measures how well the model memorised that batch (1.0 in the tables),
    not generalisation: these rows are for images/s, and the tables label them synthetic.
    """
    channels, size = input_shape(args)
    steps = max(1, (args.subset or 10_240) // args.batch_size)
    return (
        SyntheticLoader(args.batch_size, size, steps, device, channels),
        SyntheticLoader(args.batch_size, size, 2, device, channels),
    )


# ----------------------------------------------------------------------------------------------------------------
# Models


class SmallCNN(nn.Sequential):
    """Two conv blocks and a classifier: (N, C, 28, 28) float32 -> (N, 10) logits; 0.4 M parameters, ~4 MMAC/image.

    Reaches >= 91 % Fashion-MNIST test accuracy in 2 epochs with the scripts' defaults (see results/).
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28):
        side = image_size // 4
        super().__init__(
            nn.Conv2d(in_channels, 32, 3, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * side * side, 128),
            nn.ReLU(inplace=True),
            nn.Linear(128, num_classes),
        )


class MLP(nn.Sequential):
    """Flatten, one hidden layer of 256, ReLU, classifier: (N, C, S, S) -> (N, 10) logits; 0.2 M parameters at 28 px.

    No batch statistics (no BatchNorm, no dropout), so a gradient over a batch is exactly the mean of the gradients
    over its parts: the model for testing gradient accumulation against one big batch.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28):
        super().__init__(
            nn.Flatten(),
            nn.Linear(in_channels * image_size * image_size, 256),
            nn.ReLU(inplace=True),
            nn.Linear(256, num_classes),
        )


def vit_patch_size(image_size: int) -> int:
    """The patch side of `build_model("vit")` for S x S images: 4 px below 64 px (the small ViT), 16 px from 64 px
    (ViT-B/16). The side must be a multiple of it (`parse_args` checks)."""
    return 4 if image_size < 64 else 16


def build_model(name: str, in_channels: int = 1, image_size: int = 28, num_classes: int = 10) -> nn.Module:
    """`cnn` (SmallCNN), `mlp` (MLP), torchvision ResNet-18/50 or `vit` (torchvision VisionTransformer) with randomly
    initialised weights, for (N, C, S, S) float32 input and (N, num_classes) logits.

    For small images (S < 64, e.g. Fashion-MNIST's 28 px) the ResNet stem is adapted as for CIFAR (He et al. 2016,
    section 4.2): a 3x3 stride-1 first convolution and no max-pool, so 28 px are not shrunk to 7 px by the stem.
    `in_channels` replaces the first convolution's 3.

    `vit` below 64 px is a small ViT: 4 x 4 patches (28 px: 49 patch tokens + the class token = 50 tokens), width
    128, 6 encoder blocks of 4 heads, MLP 512; 1.2 M parameters at 28 px, about 3.5 minutes per Fashion-MNIST epoch
    (60,000 images) in float32 on 2 AMD EPYC cores. From 64 px it is ViT-B/16 (Dosovitskiy et al. 2021, table 1):
    16 x 16 patches (224 px: 196 + 1 tokens), width 768, 12 blocks of 12 heads, MLP 3072; 85.8 M parameters at
    224 px with 10 classes. Its patch embedding is a Conv2d of kernel = stride = patch, built for `in_channels`
    (1 for Fashion-MNIST). Encoder blocks (`model.encoder.layers`) run nn.MultiheadAttention, which calls
    scaled_dot_product_attention; no dropout, so runs are deterministic for a seed. Raises ValueError when S is not
    a multiple of the patch side (`vit_patch_size`).
    """
    if name == "cnn":
        return SmallCNN(in_channels, num_classes, image_size)
    if name == "mlp":
        return MLP(in_channels, num_classes, image_size)
    import torchvision  # only for the ResNets and the ViT: its import adds seconds to start-up

    if name == "vit":
        patch = vit_patch_size(image_size)
        if image_size % patch:
            raise ValueError(f"--model vit needs an image side that is a multiple of {patch} px, not {image_size}")
        width, depth, heads, mlp = (128, 6, 4, 512) if patch == 4 else (768, 12, 12, 3072)
        model = torchvision.models.VisionTransformer(
            image_size, patch, depth, heads, width, mlp, num_classes=num_classes
        )
        if in_channels != 3:  # initialised as torchvision initialises its own (LeCun normal, zero bias)
            model.conv_proj = nn.Conv2d(in_channels, width, patch, stride=patch)
            fan_in = in_channels * patch * patch
            nn.init.trunc_normal_(model.conv_proj.weight, std=(1 / fan_in) ** 0.5)
            nn.init.zeros_(model.conv_proj.bias)
        return model

    model = getattr(torchvision.models, name)(weights=None, num_classes=num_classes)
    if image_size < 64:
        model.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
    return model


# ----------------------------------------------------------------------------------------------------------------
# Evaluation


@torch.no_grad()
def evaluate(model: nn.Module, loader, device: torch.device) -> tuple[float, float]:
    """Mean cross-entropy and top-1 accuracy (a fraction in [0, 1]) over every sample `loader` yields.

    Images go to `device`; the labels follow the logits (which may come out on another device, as in model
    parallelism). Counts the samples it sees, so for Fashion-MNIST's test set it averages over exactly 10,000 images.
    Leaves the model in eval mode; the caller switches back with `model.train()`.
    """
    model.eval()
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    seen = 0
    for images, labels in loader:
        logits = model(images.to(device, non_blocking=True))
        labels = labels.to(logits.device, non_blocking=True)
        loss_sum += nn.functional.cross_entropy(logits.float(), labels, reduction="sum").to(device)
        correct += (logits.argmax(1) == labels).sum().to(device)
        seen += labels.numel()
    return loss_sum.item() / seen, correct.item() / seen


# ----------------------------------------------------------------------------------------------------------------
# The meter: images/s, step time, data-wait, memory


class Meter:
    """Times training steps on the host, with device synchronisation only at the edges of the measured window.

    `device` is the device the steps run on, or a list of them (model parallelism): every one is synchronised.
    Use: `for batch in meter.loader(train_loader): ...; meter.step(n_images)`; `meter.pause()` before evaluation and
    `meter.resume()` after it (both synchronise), `meter.summary()` at the end.
    - images/s: images of the steps after the first `warmup_steps`, divided by the seconds of the window(s) they
      ran in. Each window starts and ends with `torch.cuda.synchronize()`, so queued GPU work is counted in full.
      Multiply by the world size (or sum over ranks, `gather_summary`) for a global figure. A run with no step after
      the warm-up has no window: images/s is None and `images_per_s_note` says why ("not measured", never 0).
    - step time p50/p90 (ms): host time between consecutive `step()` calls inside the window. Between the edges
      nothing synchronises, so on a GPU this is the rate at which the host can queue steps (equal to the GPU's rate
      once its queue is full); on CPU it is the step time itself.
    - data-wait fraction: seconds blocked in `next(loader)` inside the window / window seconds (every `next()`
      between two steps counts, so K micro-batches per step are all counted).
    - first step (s): host seconds from the start of training to the end of the first step: where torch.compile
      compiles, cuDNN autotunes and DataLoader workers start.
    - activation memory (MiB): what autograd keeps for backward, measured, not estimated, on the first batch the
      loader yields (one micro-batch under gradient accumulation): from that batch's arrival to the next `next()`,
      `step()` or `pause()`, a `torch.autograd.graph.saved_tensors_hooks` pack hook records the storage of every
      tensor saved for backward, except parameters and views of them (leaves that require grad, e.g. the `weight.t()`
      nn.Linear saves; autocast's low-precision copies of them do count), and the distinct storages' bytes are
      summed. All of them are alive together at the end of the
      forward. Under activation checkpointing, torch.utils.checkpoint saves a block's inputs here and the tensors of
      its recompute under its own inner hooks, which are not counted: they live only during that block's backward.
    - training FLOPs per image: `torch.utils.flop_counter.FlopCounterMode` from the arrival of the second step's
      batch to `step()` (all its micro-batches), divided by its images: forward and backward matmuls, convolutions
      and attention as they ran (a multiply-add counts 2; elementwise ops, the loss and the optimizer are not
      counted; an activation-checkpointing recompute is: hardware FLOPs, not the model's). DataParallel's
      replicas run their forward in threads the counter does not see (train_DP.py reports none on 2+ GPUs). The second step, not the first: a compiled model compiles
      at its first call, and under the counter it would run eagerly and compile a step later. That step runs slower
      (Python sees every op): it is a warm-up step unless --warmup-steps is below 2.
    """

    def __init__(self, device: torch.device | list[torch.device], warmup_steps: int = 10):
        self.devices = list(device) if isinstance(device, (list, tuple)) else [device]  # all are synchronised
        self.device, self.warmup_steps = self.devices[0], warmup_steps
        self.steps = 0  # all steps, warm-up included
        self.images = 0  # images inside the window(s)
        self.windows = 0  # windows opened: more than one means epoch edges (or evaluations) fall between them
        self.excluded_steps = 0  # steps after the warm-up kept out of the window: step(..., measured=False)
        self.window_s = self.wait_s = 0.0
        self.step_s: list[float] = []
        self.first_step_s = None
        self._t_start = self._t_last = None  # start of the open window, end of the previous step
        self._wait = 0.0
        self.train_s = 0.0  # all training seconds between resume() and pause(), warm-up included
        self._t_train = None
        self._progress = (time.perf_counter(), 0, 0)  # (time, steps, images) at the last progress() call
        self._all_images = 0
        self.activation_bytes = None  # measured on the first batch
        self._saved_hooks, self._storages = None, {}
        self.flops_per_image = None  # counted on the second step
        self._flop_counter = None
        for d in self.devices:
            if d.type == "cuda":
                torch.cuda.reset_peak_memory_stats(d)

    def _sync(self) -> float:
        for d in self.devices:
            if d.type == "cuda":
                torch.cuda.synchronize(d)
        return time.perf_counter()

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        """The pack hook: record the storage of a tensor saved for backward, unless it is a parameter or a view of
        one (nn.Linear saves `weight.t()`), and keep the tensor."""
        base = tensor._base if tensor._base is not None else tensor
        if not (tensor.is_leaf and tensor.requires_grad) and not (base.is_leaf and base.requires_grad):
            try:
                storage = tensor.untyped_storage()
            except (RuntimeError, NotImplementedError):  # a sparse tensor or a subclass without one storage
                return tensor
            self._storages[(storage.data_ptr(), str(tensor.device))] = storage.nbytes()
        return tensor

    def _stop_counting(self) -> None:
        if self._saved_hooks is not None:
            self._saved_hooks.__exit__(None, None, None)
            self._saved_hooks = None
            self.activation_bytes = sum(self._storages.values())

    def loader(self, iterable):
        """Yield from `iterable`, timing how long each `next()` blocks (the data-wait); while the consumer works on
        the first batch, count the tensors autograd saves for backward (the activation memory)."""
        iterator = iter(iterable)
        while True:
            self._stop_counting()
            t0 = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self._wait += time.perf_counter() - t0
            if self.activation_bytes is None and self._saved_hooks is None:
                self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)
                self._saved_hooks.__enter__()
            if self.steps == 1 and self.flops_per_image is None and self._flop_counter is None:
                self._flop_counter = FlopCounterMode(display=False)  # until step(): every micro-batch of the step
                self._flop_counter.__enter__()
            yield batch

    def step(self, n_images: int, measured: bool = True) -> None:
        """Record the end of one optimizer step over `n_images` images (per process). `measured=False` keeps a step
        after the warm-up out of images/s, step times and data-wait (train_compile.py: a step in which torch.compile
        recompiled): the window closes at the previous step's end and a new one opens at this step's end. On a GPU,
        work the previous steps left queued finishes inside that step and is left out too (at most a few steps'
        worth against the seconds of a compile); `excluded_steps` in the summary counts such steps."""
        self._stop_counting()
        if self._flop_counter is not None:
            self._flop_counter.__exit__(None, None, None)
            flops, self._flop_counter = self._flop_counter.get_total_flops(), None
            self.flops_per_image = flops / n_images if flops else 0.0
        self.steps += 1
        self._all_images += n_images
        if self.first_step_s is None and self._t_train is not None:
            self.first_step_s = self.train_s + time.perf_counter() - self._t_train
        wait, self._wait = self._wait, 0.0
        if self._t_start is None:
            if self.steps >= self.warmup_steps:
                self.resume()  # the window opens after the last warm-up step
            return
        if not measured:  # close the window at the previous step's end, open the next one now
            self.window_s += self._t_last - self._t_start
            self._t_start = self._t_last = self._sync()
            self.windows += 1
            self.excluded_steps += 1
            return
        now = time.perf_counter()
        self.step_s.append(now - self._t_last)
        self.images += n_images
        self.wait_s += wait
        self._t_last = now

    def progress(self) -> str:
        """ "X images/s, Y ms/step" since the previous call (host clock; call it right after a synchronising
        `loss.item()`, so the GPU's queued work is counted)."""
        now = time.perf_counter()
        t, steps, images = self._progress
        self._progress = (now, self.steps, self._all_images)
        if self.steps == steps or now == t:
            return "no step since the last line"
        return f"{(self._all_images - images) / (now - t):.0f} images/s, {1e3 * (now - t) / (self.steps - steps):.1f} ms/step"

    def pause(self) -> None:
        """Stop the training clock and close the open window, synchronising the device (e.g. before evaluation)."""
        self._stop_counting()
        if self._flop_counter is not None:  # the loop left before the counted step's end (SIGTERM): nothing counted
            self._flop_counter.__exit__(None, None, None)
            self._flop_counter = None
        now = self._sync()
        if self._t_start is not None:
            self.window_s += now - self._t_start
            self._t_start = None
        if self._t_train is not None:
            self.train_s += now - self._t_train
            self._t_train = None

    def resume(self) -> None:
        """Start the training clock and, once the warm-up steps are done, open a window (synchronising the device)."""
        if self._t_train is None:
            self._t_train = self._sync()
            self._progress = (self._t_train, self.steps, self._all_images)
        if self.steps >= self.warmup_steps and self._t_start is None:
            self._t_start = self._t_last = self._sync()
            self._wait = 0.0
            self.windows += 1

    def summary(self) -> dict:
        """Per-process figures: images_per_s (None and a note when not measured), step_ms_p50/p90, data_wait_frac,
        measured_steps, windows, first_step_s, train_s (s), activation_mib (MiB; None when no batch was trained),
        flops_per_image (None when the run had one step, or no model) and peak memory (GiB, `memory_stats`)."""
        self.pause()
        measured = len(self.step_s)
        quantiles = statistics.quantiles(self.step_s, n=10, method="inclusive") if measured >= 2 else [None] * 9
        note = None
        if not measured:
            note = (
                f"not measured: the run's {self.steps} steps are all within --warmup-steps {self.warmup_steps}; "
                "run more steps or lower --warmup-steps"
            )
        return {
            "images_per_s": self.images / self.window_s if measured else None,
            "images_per_s_note": note,
            "step_ms_p50": 1e3 * statistics.median(self.step_s) if measured else None,
            "step_ms_p90": 1e3 * quantiles[8] if measured >= 2 else None,
            "data_wait_frac": self.wait_s / self.window_s if measured else None,
            "measured_steps": measured,
            "measured_s": self.window_s,
            "windows": self.windows,
            "excluded_steps": self.excluded_steps,
            "first_step_s": self.first_step_s,
            "train_s": self.train_s,
            "activation_mib": self.activation_bytes / 2**20 if self.activation_bytes is not None else None,
            "flops_per_image": self.flops_per_image or None,
            **memory_stats(),
        }


def memory_stats() -> dict:
    """Peak memory so far: per CUDA device allocated / reserved (GiB, since the last reset) and host RSS (GiB).

    Host RSS is `getrusage(RUSAGE_SELF).ru_maxrss` (KiB on Linux): this process only, not DataLoader workers.
    """
    devices = [
        {
            "index": i,
            "name": torch.cuda.get_device_name(i),
            "peak_allocated_gib": torch.cuda.max_memory_allocated(i) / GIB,
            "peak_reserved_gib": torch.cuda.max_memory_reserved(i) / GIB,
        }
        for i in range(torch.cuda.device_count())
        if torch.cuda.is_initialized()
    ]
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "peak_mem_allocated_gib": max((d["peak_allocated_gib"] for d in devices), default=None),
        "peak_mem_reserved_gib": max((d["peak_reserved_gib"] for d in devices), default=None),
        "peak_mem_per_device": devices,
        "peak_host_rss_gib": rss_kib * 1024 / GIB,
    }


def gather_summary(summary: dict) -> dict:
    """A `Meter.summary()` made global over the ranks of the default process group (every rank must call it):
    images/s summed (each rank measured its own share), peak memory the maximum over ranks, `peak_mem_per_device`
    every rank's devices (with their rank), data-wait, step times, activation_mib and flops_per_image those of this
    rank (every rank trains the same model on as many images a step)."""
    per_rank = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, summary)
    merged = dict(summary)
    rates = [r["images_per_s"] for r in per_rank]
    merged["images_per_s"] = sum(rates) if None not in rates else None
    merged["images_per_s_per_rank"] = rates
    for key in ["peak_mem_allocated_gib", "peak_mem_reserved_gib", "peak_host_rss_gib"]:
        merged[key] = max((r[key] for r in per_rank if r[key] is not None), default=None)
    merged["peak_mem_per_device"] = [
        {**d, "rank": i} for i, r in enumerate(per_rank) for d in r["peak_mem_per_device"] if d["peak_reserved_gib"]
    ]
    return merged


# ----------------------------------------------------------------------------------------------------------------
# Per-epoch records, the closing report and the metrics JSON


def epoch_record(epoch: int, step: int, train_loss, val_loss, val_acc, meter: Meter, logits=None, **extra) -> dict:
    """One entry of the metrics' `epochs` list: 1-based `epoch`, global `step`, mean `train_loss` (a 0-d tensor or a
    float; None when nothing was trained), test `val_loss` / `val_acc` (fractions), training seconds so far, and
    the dtype the logits came out in (what the model really computed in). `extra` adds fields (e.g. label counts).
    Reading a tensor loss synchronises the device, so call it after `meter.pause()`."""
    return {
        "epoch": epoch,
        "step": step,
        "train_loss": train_loss.item() if torch.is_tensor(train_loss) else train_loss,
        "val_loss": val_loss,
        "val_acc": val_acc,
        "train_s": meter.train_s,
        "logits_dtype": str(logits.dtype) if logits is not None else None,
        **extra,
    }


def epoch_line(record: dict) -> str:
    """The end-of-epoch progress line of an `epoch_record`."""
    parts = [f"epoch {record['epoch']}:"]
    if record["train_loss"] is not None:
        parts.append(f"train loss {record['train_loss']:.4f},")
    if record.get("images") is not None:
        parts.append(f"{record['images']} images,")
    if record["val_acc"] is not None:
        parts.append(f"test loss {record['val_loss']:.4f}, test acc {100 * record['val_acc']:.2f} %,")
    return " ".join(parts) + f" {record['train_s']:.1f} s of training"


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


def cpu_info() -> dict:
    """The CPU model (from /proc/cpuinfo, else `platform.processor()`) and which of the instruction sets that decide
    low-precision speed it has: avx2, avx512f, avx512_bf16 (bf16 dot products), amx_tile / amx_bf16 (Intel AMX).
    `bf16_instructions` is True when either bf16 set is there: bfloat16 autocast then runs natively on the CPU,
    otherwise it is emulated and slower than float32."""
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


class WriteFailed(OSError):
    """A file could not be written (disk full, I/O error, its folder removed, a file size limit). Its message is one
    line that names the file and the operating system's error, e.g. "cannot write ck/last.pt (No space left on
    device)"; `path` and `reason` hold the two parts. `atomic_write` raises it after removing its temporary file, so
    the file that was there before is left as it was."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"cannot write {path} ({reason})")
        self.path, self.reason = Path(path), reason


def _os_error(error: BaseException) -> OSError | None:
    """The OSError behind `error`: itself, or one in its chain of causes (torch.save reports a failed write of a
    Python file object as a RuntimeError whose context is the OSError)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def atomic_write(path: Path, write) -> None:
    """Write `path` through a temporary file beside it (`.NAME.PID.tmp`): `write(f)` fills the binary file object
    `f`, which is then flushed, fsync'ed (the bytes are on disk before the rename) and renamed over `path`
    (`os.replace`, atomic on POSIX; the folder is fsync'ed after it). Readers never see half a file, and a process killed at any moment leaves either
    the old file or the new one (the temporary file of a SIGKILLed writer can stay: `save_checkpoint` removes those).

    Raises WriteFailed when the write fails with an OSError (ENOSPC, EIO, EFBIG under a file size limit, a vanished
    folder), directly or behind another exception (torch.save); anything else (a bug, Ctrl-C) is re-raised as it
    is. Either way the temporary file is removed first and `path` keeps what it held.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)  # the rename itself on disk, so that a crash right after keeps the new file
        finally:
            os.close(folder)
    except BaseException as error:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # the folder itself is gone: no temporary file left either
        cause = _os_error(error) if isinstance(error, Exception) else None
        if cause is not None:
            raise WriteFailed(path, cause.strerror or first_line(cause)) from None
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` with `atomic_write`; raises WriteFailed (one line) when it cannot."""
    atomic_write(path, lambda f: f.write(text.encode()))


def write_metrics(path: Path | None, **fields) -> dict:
    """Write `fields` plus `command` and `env` (`environment()`) as JSON to `path`, atomically; nothing if `path` is
    None. Returns the dict. If the write fails (disk full, the folder removed during the run), the metrics go to
    `./metrics-<pid>.json` and to stdout, and the script exits 1 with one line saying where: a finished run is never
    lost."""
    record = {"command": [sys.executable, *sys.argv], **fields, "env": environment()}
    if path is None:
        return record
    text = json.dumps(record, indent=2, default=str) + "\n"
    try:
        atomic_write_text(path, text)
    except WriteFailed as error:
        fallback = Path.cwd() / f"metrics-{os.getpid()}.json"
        try:
            atomic_write_text(fallback, text)
            where = f"written to {fallback} instead (and printed above)"
        except WriteFailed:
            where = "printed above"
        print(text, flush=True)
        die(f"cannot write --metrics-out {path} ({error.reason}); the run's metrics are {where}", code=1)
    return record


def report(args: argparse.Namespace, summary: dict, epochs: list[dict], **fields) -> dict:
    """The closing call of every script: print the run's images/s line and write its metrics JSON (--metrics-out).

    `summary` is `Meter.summary()` (made global over ranks where there are several); `epochs` the `epoch_record`s.
    `script` (the running file's name) and `technique` (its docstring's title: the first line up to the colon, e.g.
    "Mixed precision (AMP)") are derived here, so a variant passes only what really differs.
    `fields` are what the script says about itself: precision, device, steps, test_images, and
    where they differ from one process on one device: world_size (default 1), gpus (devices used; default 1 on
    CUDA, 0 on CPU), global_batch (default batch x world size), model, dataset; `compile_s` for compiled models;
    and anything else to record (loader, workers, ...). Derived here: test_acc (the last epoch's), the training
    seconds until the test accuracy first reached --target-acc (`time_to_target_s`, with `compile_s` taken out;
    `time_to_target_incl_compile_s` with it), `achieved_tflops` (flops_per_image x images/s / 1e12, TFLOP/s: the
    training matmul/conv/attention work done per second, all ranks together), the resolved arguments (`args`, every flag with its default), and the
    run's `status` (`run_status`: ok, terminated by SIGTERM at `stopped_at_step`, or checkpoint not written, with
    `failed_writes`). The metrics JSON keys are listed in docs/bench.md.
    """
    device = torch.device(fields.pop("device"))
    main = sys.modules["__main__"]
    fields.setdefault("script", Path(getattr(main, "__file__", None) or sys.argv[0]).name)
    fields.setdefault("technique", (getattr(main, "__doc__", None) or "").strip().split("\n")[0].split(":")[0])
    world_size = fields.setdefault("world_size", 1)
    fields.setdefault("gpus", int(device.type == "cuda"))
    fields.setdefault("batch_size", args.batch_size)
    fields.setdefault("global_batch", args.batch_size * world_size)
    fields.setdefault("model", args.model)
    fields.setdefault("dataset", getattr(args, "dataset", None))
    reached = [e for e in epochs if args.target_acc and e["val_acc"] is not None and e["val_acc"] >= args.target_acc]
    compile_s = fields.get("compile_s") or 0.0
    if summary["images_per_s"] is None:
        line = summary["images_per_s_note"]
    else:
        wait = summary["data_wait_frac"]
        line = f"{summary['images_per_s']:.1f} images/s, data-wait {100 * wait:.1f} %"
    flops = summary.get("flops_per_image")
    achieved = flops * summary["images_per_s"] / 1e12 if flops and summary["images_per_s"] else None
    if achieved is not None:
        line += f", {achieved:.3g} TFLOP/s ({flops / 1e9:.3g} GFLOPs per image)"
    if summary.get("activation_mib") is not None:
        line += f", activations saved for backward {summary['activation_mib']:.1f} MiB"
    print(f"{line}, peak host RSS {summary['peak_host_rss_gib']:.2f} GiB", flush=True)
    return write_metrics(
        args.metrics_out,
        **fields,
        device=str(device),
        **summary,
        achieved_tflops=achieved,
        epochs=epochs,
        test_acc=epochs[-1]["val_acc"] if epochs else None,
        target_acc=args.target_acc,
        time_to_target_s=reached[0]["train_s"] - compile_s if reached else None,
        time_to_target_incl_compile_s=reached[0]["train_s"] if reached else None,
        args={key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()},
        status=run_status(),
        stopped_at_step=RUN["stopped_at"],
        failed_writes=RUN["failed_writes"],
    )


def run_status() -> str:
    """The metrics' `status`: "ok"; "terminated" (SIGTERM stopped the run, `Preemption`); or "checkpoint not
    written" (a checkpoint write failed: the run trained on and reports its numbers, `save_checkpoint`)."""
    if RUN["failed_writes"]:
        return "checkpoint not written"
    return "terminated" if RUN["stopped_at"] is not None else "ok"


# ----------------------------------------------------------------------------------------------------------------
# Checkpoints


# 1: the files before 2026-11-23 (no version, no made_by); 2: + format, made_by, state holders; 3: + subset, seed,
# accumulation steps in made_by
CHECKPOINT_FORMAT = 3
# What a checkpoint must share with the run that resumes it: what fixes the model, the optimizer, and which samples an
# epoch's steps take in which order (a mid-epoch resume skips the done steps' samples, so --subset, --seed and
# --accum-steps must not change); anything else (epochs, max steps, lr, workers...) may change.
CHECKPOINT_MATCH = {
    "script": "script",
    "model": "model",
    "dataset": "dataset",
    "image_size": "image size",
    "subset": "subset",
    "seed": "seed",
    "world_size": "world size",
    "batch_size": "batch per process",
    "accum_steps": "accumulation steps",
    "optimizer": "optimizer",
    "state": "extra state",
}


def checkpoint_origin(args: argparse.Namespace, optimizer: torch.optim.Optimizer | None, **holders) -> dict:
    """What a checkpoint of this run says made it (`made_by`), keyed like CHECKPOINT_MATCH: the script's file name,
    --model, --dataset (a loader's --data-dir folder name), --image-size, --subset, --seed, the world size
    (torch.distributed's, else 1), --batch-size (per process), --accum-steps (None where the script has no such flag),
    the optimizer's class, and `state`: the names of the `holders` (GradScaler...) whose state_dict is not empty (a
    disabled GradScaler has none). Plus the torch version, for the record."""
    dataset = getattr(args, "dataset", None) or Path(getattr(args, "data_dir", "")).resolve().name
    return {
        "script": Path(sys.argv[0]).name,
        "model": args.model,
        "dataset": dataset,
        "image_size": getattr(args, "image_size", None),
        "subset": getattr(args, "subset", None),
        "seed": args.seed,
        "world_size": dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1,
        "batch_size": args.batch_size,
        "accum_steps": getattr(args, "accum_steps", None),
        "optimizer": type(optimizer).__name__ if optimizer is not None else None,
        "state": sorted(name for name, holder in holders.items() if holder.state_dict()),
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
    step: int, **extra,
) -> bool:  # fmt: skip
    """Save model and optimizer state, the number of finished `epoch`s, the global `step` and `extra` to `path`.

    `model` is a module or its state dict (FSDP gathers a full one); `optimizer` None leaves the optimizer's state out
    (FSDP keeps it in its sharded checkpoint).

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
    its sharded state itself).

    Checks before loading anything: the format version, then that the file was made by a run like this one (every
    CHECKPOINT_MATCH key of `checkpoint_origin`: same script, model, data, subset, seed, world size, batch per
    process, accumulation steps, optimizer and extra state), so a resume never trains from a partially loaded or
    silently different state, nor skips other samples than the ones its epoch already trained on. Exits with one
    line (exit 2) that names the file, what it was saved from and what this run asked for, or why it is unreadable
    (not a checkpoint, truncated, or a pickle with code in it: loaded with weights_only=True).
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
            optimizer.load_state_dict(state["optimizer"])
        for name, holder in holders.items():
            holder.load_state_dict(state[name])
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        die(f"--resume: {path} does not fit this model and optimizer ({first_line(error)}); use a new --checkpoint-dir")
    RUN["saved"] = (Path(path), state["step"])  # what the file on disk holds, until the next save
    return state


def exit_if_finished(checkpoint: Path, step: int, total_steps: int, master: bool = True) -> None:
    """After `--resume`: if the checkpoint's global `step` already reaches this run's `total_steps`, the run is
    finished: the process whose `master` is True says so in one line (under torchrun every rank calls this, and only
    rank 0 passes True), every process leaves its process group and exits with status 0, so that re-running a
    finished job, e.g. a requeued one, is harmless. Otherwise it returns. Raises SystemExit(0) when finished."""
    if step < total_steps:
        return
    if master:
        print(f"{checkpoint} holds a finished run ({step} of {total_steps} steps): nothing left to train", flush=True)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    raise SystemExit(0)


# ----------------------------------------------------------------------------------------------------------------
# Preemption: SIGTERM stops a run at a step boundary, saved


class Preemption:
    """What a training loop does with SIGTERM, the signal Slurm (`#SBATCH --signal=TERM@120`), Kubernetes, `timeout`
    and torchrun (passing on its own) send before they kill a job: finish the step in flight, save, leave.

    Creating it installs the SIGTERM handler, which only sets a flag: the step in flight runs to its end. Use:
    `if preemption.requested(step): break` at the top of each step, then, after the loop, save a checkpoint at that
    step boundary and skip the evaluation when `preemption.stopped_at` is set; `report` writes the metrics of what
    finished with status "terminated"; `preemption.exit()` as the script's last line prints one line and exits 143
    (128 + 15, the shell's code for SIGTERM). A second SIGTERM ends the process at once, as without the handler; one
    that comes within a second of the first is the same signal passed on, not a second one (Slurm signals every
    process of a job step, torchrun too, and torchrun passes it on to its workers at once).

    Under torch.distributed (created after `init_process_group`, by every rank), `requested` all-reduces the flag
    (MAX) at every step boundary, so every rank stops at the same step even when the signal reaches them at different
    moments, and no rank is left waiting in a collective the others will never join. The all-reduce runs on a gloo
    group of CPU tensors (a new one when the default group is NCCL): it never synchronises a GPU stream; on 2 CPU
    processes it is one small gloo all-reduce a step. DataLoader workers ignore SIGTERM (`seed_worker`): a signal sent to the
    whole process group (Slurm, `timeout`) must not kill them under a main process that is still finishing its step.
    """

    def __init__(self):
        self._signalled = 0.0  # when the first SIGTERM came (time.monotonic), 0 before
        self.stopped_at = None  # the step the run stopped at, once `requested` said so
        signal.signal(signal.SIGTERM, self._handle)
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self._group = None
        self._master = not distributed or dist.get_rank() == 0  # the one that prints
        if distributed:
            self._group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD

    def _handle(self, signum, frame) -> None:
        now = time.monotonic()
        if self._signalled and now - self._signalled > 1.0:  # a second SIGTERM: die of it now
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        self._signalled = self._signalled or now  # (seconds; within 1 s of the first, the same signal passed on)

    def requested(self, step: int) -> bool:
        """Whether the run stops before its next step: True once this process (or, under torch.distributed, any
        rank) got SIGTERM. Records `step` (the global step count so far: the boundary) in `stopped_at` and in
        RUN["stopped_at"], which `report` reads."""
        stop = bool(self._signalled)
        if self._group is not None:
            flag = torch.tensor([int(stop)])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
            stop = bool(flag.item())
        if stop and self.stopped_at is None:
            self.stopped_at = RUN["stopped_at"] = step
        return stop

    def exit(self) -> None:
        """The script's last line. After a failed checkpoint write (its line was printed then): exit 1. After a
        SIGTERM that stopped the run: rank 0 prints "terminated by SIGTERM at step N; ..." on stderr, saying which
        checkpoint holds that step (resume with --resume) or that none does, and every rank exits 143. Otherwise
        (a SIGTERM that came after the last step changes nothing) it returns."""
        if RUN["failed_writes"]:
            raise SystemExit(1)
        step = RUN["stopped_at"]
        if step is None:
            return
        if self._master:
            saved = RUN["saved"]
            where = (
                f"{saved[0]} holds it: resume with --resume"
                if saved and saved[1] == step
                else "no --checkpoint-dir, so nothing to resume from"
            )
            print(
                f"{Path(sys.argv[0]).name}: terminated by SIGTERM at step {step}; {where}", file=sys.stderr, flush=True
            )
        raise SystemExit(143)


# ----------------------------------------------------------------------------------------------------------------
# ImageFolder helpers (the loaders)


class BadImage(ValueError):
    """Raised by `load_rgb` for a file that is not a readable image; the scripts report it in one line and exit 2."""


def load_rgb(path: str):
    """ImageFolder's `loader`: open `path` with PIL as an RGB image (greyscale is converted to 3 channels).

    Raises BadImage naming the file if it is corrupt, truncated or not an image.
    """
    from PIL import Image

    try:
        with open(path, "rb") as f:
            image = Image.open(f)
            return image.convert("RGB")  # decodes the whole file: a truncated JPEG fails here
    except (OSError, ValueError, SyntaxError) as error:
        raise BadImage(f"{path} is not a readable image ({error}); remove or replace it") from None


def find_non_image(folder: Path) -> Path | None:
    """The first file under `folder` with an image extension whose first bytes are not a JPEG or PNG signature.

    A cheap header check (4 bytes a file) that names the culprit when a decoder reports only "cannot decode".
    """
    signatures = (b"\xff\xd8\xff", b"\x89PNG")
    for path in sorted(folder.rglob("*")):
        if path.suffix.lower() in IMAGE_EXTENSIONS and path.is_file():
            with open(path, "rb") as f:
                if not f.read(4).startswith(signatures):
                    return path
    return None


def image_folders(data_dir: Path, batch_size: int) -> tuple[Path, Path, list[str]]:
    """`(train_dir, val_dir, class_names)` of an ImageFolder root that holds train/<class>/ and val/<class>/.

    Exits with one line on stderr when the folder is missing or empty, lacks train/ or val/, a split has no class
    folder with an image file (`IMAGE_EXTENSIONS`), the two splits name different classes, or train/ holds fewer
    images than one `batch_size` (every epoch drops its last partial batch, so it would run no step).
    """
    how = "run `python bench/prepare_data.py`, or pass --data-dir ROOT with ROOT/train/<class>/*.jpg and ROOT/val/..."
    if not data_dir.is_dir():
        die(f"--data-dir {data_dir} does not exist; {how}")
    if not any(data_dir.iterdir()):
        die(f"--data-dir {data_dir} is empty; {how}")
    classes = {}
    for split in ("train", "val"):
        folder = data_dir / split
        if not folder.is_dir():
            die(f"--data-dir {data_dir} has no {split}/ folder; {how}")
        classes[split] = sorted(
            d.name
            for d in folder.iterdir()
            if d.is_dir() and any(f.suffix.lower() in IMAGE_EXTENSIONS for f in d.iterdir())
        )
        if not classes[split]:
            die(f"{folder} has no class folder with {'/'.join(IMAGE_EXTENSIONS)} files; {how}")
    if classes["train"] != classes["val"]:
        die(f"{data_dir}/train and {data_dir}/val have different class folders; give both the same classes")
    images = sum(
        1
        for c in classes["train"]
        for f in os.scandir(data_dir / "train" / c)
        if f.name.lower().endswith(IMAGE_EXTENSIONS)
    )
    if images < batch_size:
        die(f"--batch-size {batch_size} is larger than the {images} images in {data_dir / 'train'}; lower --batch-size")
    return data_dir / "train", data_dir / "val", classes["train"]


# ----------------------------------------------------------------------------------------------------------------
# Errors: one line on stderr, no traceback


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none), at most 160 characters: what a
    one-line error quotes of a library's multi-line message."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:160]


def die(message: str, code: int = 2) -> None:
    """Print `message` as one line on stderr, prefixed with the script name, and exit with `code` (no traceback)."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def _is_out_of_memory(kind, value) -> bool:
    """MemoryError, torch.OutOfMemoryError (CUDA), or the CPU allocator's RuntimeError "can't allocate memory"."""
    return issubclass(kind, (MemoryError, torch.OutOfMemoryError)) or (
        issubclass(kind, RuntimeError) and ("can't allocate memory" in str(value) or "out of memory" in str(value))
    )


def _report_user_errors(kind, value, traceback) -> None:
    """sys.excepthook: one line on stderr, no traceback, for what the user can fix or caused.

    A BadImage (raised here or re-raised from a DataLoader worker): exit 2. A file that cannot be written
    (WriteFailed: "cannot write PATH (No space left on device)"): exit 1. Out of memory: exit 3, with the first
    line of the allocator's message ("out of memory" in it, so the bench files the run as `oom`). Ctrl-C: exit 130.
    Anything else is a bug and keeps its traceback.
    """
    if issubclass(kind, BadImage):
        # from a worker the message is "Caught BadImage in DataLoader worker ... Original Traceback ...": keep the end
        die(str(value).strip().splitlines()[-1].removeprefix("common.BadImage: "))
    if issubclass(kind, WriteFailed):
        die(str(value), code=1)
    if _is_out_of_memory(kind, value):
        die(f"out of memory ({first_line(value)}); lower --batch-size (or --image-size, --workers)", code=3)
    if issubclass(kind, KeyboardInterrupt):
        die("interrupted (Ctrl-C); with --checkpoint-dir, add --resume to continue from the last checkpoint", code=130)
    sys.__excepthook__(kind, value, traceback)


def install_error_hook() -> None:
    """Make `_report_user_errors` the process's sys.excepthook (the scripts do it through `parse_args`)."""
    sys.excepthook = _report_user_errors

"""What every training script shares, and nothing that belongs to one technique.

The scripts (`train.py`, `train_*.py`, ...) keep their training loop in the file, so that a diff shows a technique
in context; this module holds the parts they all use unchanged: the argument parser with the shared flags, seeding,
device pick, Fashion-MNIST and synthetic data, the model factory, evaluation, the throughput / memory meter, the
metrics JSON writer and the checkpoint helpers. No function here asks which technique calls it.
Importing it installs one sys.excepthook that turns the failures a user causes into one line on stderr instead of a
traceback: a BadImage (a corrupt file in an ImageFolder, even one re-raised from a DataLoader worker; exit 2), running
out of host or device memory (exit 3, advice to lower --batch-size) and Ctrl-C (exit 130).
"""

from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import json
import os
import platform
import random
import resource
import socket
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torchvision

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
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")  # what both loaders read (DALI's file reader skips other files too)


def die(message: str, code: int = 2) -> None:
    """Print `message` as one line on stderr, prefixed with the script name, and exit with `code` (no traceback)."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


# ----------------------------------------------------------------------------------------------------------------
# Command line


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (otherwise one usage error, exit 2)."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], e.g. 0.91 for 91 %, got {text}")
    return value


def get_parser(description: str | None = None) -> argparse.ArgumentParser:
    """The flags of the train*.py scripts (Fashion-MNIST or synthetic tensors); a script adds its own flags with
    `parser.add_argument` before parsing.

    Invalid values (a non-positive batch size, an unknown model, ...) make argparse print one usage error on
    stderr and exit with status 2.
    """
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="folder with the four Fashion-MNIST *-ubyte.gz files (default: data/, then "
        f"{DEBIAN_FASHION_MNIST}, then torchvision's download into data/)",
    )
    p.add_argument(
        "--dataset",
        choices=["fashion-mnist", "synthetic"],
        default="fashion-mnist",
        help="synthetic: random tensors already on the device, to measure the compute ceiling",
    )
    p.add_argument(
        "--image-size",
        type=positive_int,
        default=None,
        help="synthetic images are 3 x S x S (default 224); Fashion-MNIST is always 1 x 28 x 28",
    )
    p.add_argument(
        "--subset",
        type=positive_int,
        default=None,
        help="train on the first N training images only (synthetic: N images per epoch)",
    )
    _training_flags(p)
    return p


def get_image_folder_parser(description: str | None = None) -> argparse.ArgumentParser:
    """The flags of the loader*.py scripts, which read an ImageFolder of image files (train/ and val/ inside).

    Same training flags as `get_parser`; `--data-dir` is the ImageFolder root, `--image-size` the crop side,
    `--loader-only` skips the model to time the input pipeline alone. Bad values exit 2 with one usage line.
    """
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument(
        "--data-dir",
        type=Path,
        default=REPO / "data" / "fashion-mnist-jpeg",
        help="an ImageFolder root with train/<class>/*.jpg and val/<class>/*.jpg (python bench/prepare_data.py "
        "writes data/fashion-mnist-jpeg and data/imagenet-synthetic)",
    )
    p.add_argument("--image-size", type=positive_int, default=32, help="side of the square crops fed to the model")
    p.add_argument("--loader-only", action="store_true", help="iterate the input pipeline without the model")
    p.add_argument("--amp", action="store_true", help="bfloat16 autocast for the model (as the GPU bench runs it)")
    p.add_argument("--channels-last", action="store_true", help="NHWC memory format for model and images")
    _training_flags(p)
    return p


def _training_flags(p: argparse.ArgumentParser) -> None:
    """The flags every script shares: model, schedule, batch, workers, seed, device, metrics and checkpoints."""
    p.add_argument("--model", choices=["cnn", "resnet18", "resnet50"], default="cnn")
    p.add_argument("--epochs", type=positive_int, default=2)
    p.add_argument("--max-steps", type=positive_int, default=None, help="stop after this many optimizer steps")
    p.add_argument("--batch-size", type=positive_int, default=128, help="images per process per step")
    p.add_argument("--lr", type=_positive_float, default=5e-3, help="peak learning rate of the one-cycle schedule")
    p.add_argument(
        "--clip-grad-norm", type=_positive_float, default=None, help="clip the gradients' global L2 norm to this"
    )
    p.add_argument("--workers", type=_non_negative_int, default=2, help="DataLoader worker processes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--deterministic",
        action="store_true",
        help="bitwise-reproducible runs for a seed: deterministic algorithms only, no cuDNN autotuning (slower)",
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument(
        "--warmup-steps",
        type=_non_negative_int,
        default=10,
        help="steps left out of the images/s window (compilation, cuDNN autotuning, worker start)",
    )
    p.add_argument(
        "--target-acc",
        type=_fraction,
        default=None,
        help="report the training time until test accuracy first reaches this fraction",
    )
    p.add_argument("--metrics-out", type=Path, default=None, help="write the run's metrics JSON here")
    p.add_argument("--log-every", type=positive_int, default=50, help="print a progress line every N steps")
    p.add_argument("--checkpoint-dir", type=Path, default=None, help="save last.pt here at the end of every epoch")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint-dir/last.pt if it exists")


def parse_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Parse the command line and check the flags that only make sense together (argparse exits 2 otherwise)."""
    args = parser.parse_args()
    if args.resume and args.checkpoint_dir is None:
        parser.error("--resume needs --checkpoint-dir (the folder that holds last.pt)")
    if getattr(args, "dataset", None) == "fashion-mnist" and args.image_size not in (None, 28):
        parser.error("--image-size applies to --dataset synthetic; Fashion-MNIST images are 28 x 28")
    # Check the output folders now rather than after hours of training, when a failed write would lose the results.
    for flag, folder in (
        ("--metrics-out", args.metrics_out.parent if args.metrics_out else None),
        ("--checkpoint-dir", args.checkpoint_dir),
    ):
        if folder is None:
            continue
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            parser.error(f"{flag}: cannot create {folder} ({error.strerror})")
        if not os.access(folder, os.W_OK):
            parser.error(f"{flag}: cannot write into {folder}; pick a folder you own")
    return args


def input_shape(args: argparse.Namespace) -> tuple[int, int]:
    """(channels, side) of the images `--dataset` gives: Fashion-MNIST 1 x 28 x 28, synthetic 3 x S x S."""
    return (1, 28) if args.dataset == "fashion-mnist" else (3, args.image_size or 224)


def precision_label(device: torch.device) -> str:
    """How an fp32 model really computes: on CUDA, cuDNN runs convolutions in TF32 unless that is switched off."""
    if device.type == "cuda" and torch.backends.cudnn.allow_tf32:
        return "fp32 (TF32 convs)"
    return "fp32"


# ----------------------------------------------------------------------------------------------------------------
# Seeding and device


def seed_everything(seed: int, deterministic: bool = False) -> torch.Generator:
    """Seed Python, NumPy and torch (all devices); return a torch.Generator for the DataLoader's shuffling.

    With `deterministic`, also make every kernel reproducible, following
    https://pytorch.org/docs/stable/notes/randomness.html: `torch.use_deterministic_algorithms(True, warn_only=True)`
    (deterministic kernels where torch has them; an op without one, e.g. some pooling backward passes on CUDA, warns
    once naming itself instead of stopping the run), cuDNN without autotuning
    (`benchmark = False`, `deterministic = True`) and the cuBLAS workspace setting CUDA >= 10.2 needs
    (`CUBLAS_WORKSPACE_CONFIG=:4096:8`, set before the first cuBLAS call). DataLoader workers are seeded by
    `seed_worker` and the returned generator either way, so two runs with the same seed see the same batches.
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
    https://pytorch.org/docs/stable/notes/randomness.html#dataloader.
    """
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)


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

    Order (DESIGN.md "Data"): an explicit `data_dir` only (its `FashionMNIST/raw` subfolder counts too); else each of
    `search` (default: `data/`, `data/FashionMNIST/raw` and the Debian package's `/usr/share/datasets/fashion-mnist`);
    else torchvision's download into `data/`. Raises DataNotFound naming the three ways to get the files.
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
        try:
            torchvision.datasets.FashionMNIST(REPO / "data", train=True, download=True)
            torchvision.datasets.FashionMNIST(REPO / "data", train=False, download=True)
        except Exception as error:  # no network, a proxy, a full disk: all end in the same advice
            raise DataNotFound(
                f"no Fashion-MNIST in {', '.join(map(str, search))} and the download failed ({error}); {how}"
            ) from error
        return REPO / "data" / "FashionMNIST" / "raw"
    raise DataNotFound(f"no Fashion-MNIST in {', '.join(map(str, search))}; {how}")


def read_idx(path: Path) -> np.ndarray:
    """Read a gzipped IDX file (the MNIST format: big-endian magic, dims, then uint8 data) into a uint8 array."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def fashion_mnist(folder: Path, subset: int | None = None):
    """Fashion-MNIST as two in-memory `TensorDataset`s of (images, labels).

    images: float32 (N, 1, 28, 28), normalised with the training set's mean and std (computed here, ~0.286 / 0.353);
    labels: int64 (N,). Train has 60,000 images (the first `subset` if given), test always all 10,000.
    """
    f = {key: folder / name for key, name in FASHION_MNIST_FILES.items()}
    train_x = torch.from_numpy(read_idx(f["train_images"]).copy()).unsqueeze(1).float().div_(255)
    test_x = torch.from_numpy(read_idx(f["test_images"]).copy()).unsqueeze(1).float().div_(255)
    mean, std = train_x.mean(), train_x.std()
    train_y = torch.from_numpy(read_idx(f["train_labels"]).astype(np.int64))
    test_y = torch.from_numpy(read_idx(f["test_labels"]).astype(np.int64))
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
    train_set, test_set = fashion_mnist(folder, args.subset)
    if len(train_set) < args.batch_size:
        die(
            f"--batch-size {args.batch_size} is larger than the {len(train_set)} training images; "
            "lower --batch-size or raise --subset"
        )
    return train_set, test_set


def synthetic_data(args: argparse.Namespace, device: torch.device):
    """Return `(train_loader, test_loader)` of SyntheticLoader for `--dataset synthetic` (3 x S x S, S = 224 default).

    An epoch is `--subset` images (default 10,240) rounded down to whole batches; the test loader is two batches,
    so its accuracy is chance (~10 %) and the tables show it as synthetic.
    """
    channels, size = input_shape(args)
    steps = max(1, (args.subset or 10_240) // args.batch_size)
    return (
        SyntheticLoader(args.batch_size, size, steps, device, channels),
        SyntheticLoader(args.batch_size, size, 2, device, channels),
    )


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


def _is_out_of_memory(kind, value) -> bool:
    """MemoryError, torch.OutOfMemoryError (CUDA), or the CPU allocator's RuntimeError "can't allocate memory"."""
    return issubclass(kind, (MemoryError, torch.OutOfMemoryError)) or (
        issubclass(kind, RuntimeError) and ("can't allocate memory" in str(value) or "out of memory" in str(value))
    )


def _report_user_errors(kind, value, traceback) -> None:
    """sys.excepthook: one line on stderr, no traceback, for what the user can fix or caused.

    A BadImage (raised here or re-raised from a DataLoader worker): exit 2. Out of memory: exit 3, with the first
    line of the allocator's message ("out of memory" in it, so the bench files the run as `oom`). Ctrl-C: exit 130.
    Anything else is a bug and keeps its traceback.
    """
    if issubclass(kind, BadImage):
        # from a worker the message is "Caught BadImage in DataLoader worker ... Original Traceback ...": keep the end
        die(str(value).strip().splitlines()[-1].removeprefix("common.BadImage: "))
    if _is_out_of_memory(kind, value):
        first = (str(value).strip().splitlines() or [kind.__name__])[0][:160]
        die(f"out of memory ({first}); lower --batch-size (or --image-size, --workers)", code=3)
    if issubclass(kind, KeyboardInterrupt):
        die("interrupted (Ctrl-C); with --checkpoint-dir, add --resume to continue from the last checkpoint", code=130)
    sys.__excepthook__(kind, value, traceback)


sys.excepthook = _report_user_errors


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


def build_model(name: str, in_channels: int = 1, image_size: int = 28, num_classes: int = 10) -> nn.Module:
    """`cnn` (SmallCNN) or torchvision ResNet-18/50 with randomly initialised weights, for (N, C, S, S) float32 input.

    For small images (S < 64, e.g. Fashion-MNIST's 28 px) the ResNet stem is adapted as for CIFAR (He et al. 2016,
    section 4.2): a 3x3 stride-1 first convolution and no max-pool, so 28 px are not shrunk to 7 px by the stem.
    `in_channels` replaces the first convolution's 3; the classifier has `num_classes` outputs.
    """
    if name == "cnn":
        return SmallCNN(in_channels, num_classes, image_size)
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

    Counts the samples it sees, so for Fashion-MNIST's test set it averages over exactly 10,000 images.
    Leaves the model in eval mode; the caller switches back with `model.train()`.
    """
    model.eval()
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    seen = 0
    for images, labels in loader:
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        logits = model(images)
        loss_sum += nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
        correct += (logits.argmax(1) == labels).sum()
        seen += labels.numel()
    return loss_sum.item() / seen, correct.item() / seen


# ----------------------------------------------------------------------------------------------------------------
# The meter: images/s, step time, data-wait, memory


class Meter:
    """Times training steps on the host, with device synchronisation only at the edges of the measured window.

    Use: `for batch in meter.loader(train_loader): ...; meter.step(n_images)`; `meter.pause()` before evaluation and
    `meter.resume()` after it (both synchronise), `meter.summary()` at the end.
    - images/s: images of the steps after the first `warmup_steps`, divided by the seconds of the window(s) they
      ran in. Each window starts and ends with `torch.cuda.synchronize()`, so queued GPU work is counted in full.
      Multiply by the world size (or sum over ranks) for a global figure.
    - step time p50/p90 (ms): host time between consecutive `step()` calls inside the window. Between the edges
      nothing synchronises, so on a GPU this is the rate at which the host can queue steps (equal to the GPU's rate
      once its queue is full); on CPU it is the step time itself.
    - data-wait fraction: seconds blocked in `next(loader)` inside the window / window seconds.
    """

    def __init__(self, device: torch.device, warmup_steps: int = 10):
        self.device, self.warmup_steps = device, warmup_steps
        self.steps = 0  # all steps, warm-up included
        self.images = 0  # images inside the window(s)
        self.window_s = self.wait_s = 0.0
        self.step_s: list[float] = []
        self._t_start = self._t_last = None  # start of the open window, end of the previous step
        self._wait = 0.0
        self.train_s = 0.0  # all training seconds between resume() and pause(), warm-up included
        self._t_train = None
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def _sync(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def loader(self, iterable):
        """Yield from `iterable`, timing how long each `next()` blocks (the data-wait)."""
        iterator = iter(iterable)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self._wait = time.perf_counter() - t0
            yield batch

    def step(self, n_images: int) -> None:
        """Record the end of one optimizer step over `n_images` images (per process)."""
        self.steps += 1
        if self._t_start is None:
            if self.steps >= self.warmup_steps:
                self.resume()  # the window opens after the warm-up step
            return
        now = time.perf_counter()
        self.step_s.append(now - self._t_last)
        self.images += n_images
        self.wait_s += self._wait
        self._t_last = now

    def pause(self) -> None:
        """Stop the training clock and close the open window, synchronising the device (e.g. before evaluation)."""
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
        if self.steps >= self.warmup_steps and self._t_start is None:
            self._t_start = self._t_last = self._sync()

    def summary(self) -> dict:
        """Per-process figures: images_per_s, step_ms_p50/p90, data_wait_frac, measured_steps, memory (GiB)."""
        self.pause()
        measured = len(self.step_s)
        quantiles = statistics.quantiles(self.step_s, n=10, method="inclusive") if measured >= 2 else [None] * 9
        return {
            "images_per_s": self.images / self.window_s if measured else None,
            "step_ms_p50": 1e3 * statistics.median(self.step_s) if measured else None,
            "step_ms_p90": 1e3 * quantiles[8] if measured >= 2 else None,
            "data_wait_frac": self.wait_s / self.window_s if measured else None,
            "measured_steps": measured,
            "measured_s": self.window_s,
            "train_s": self.train_s,
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


# ----------------------------------------------------------------------------------------------------------------
# Environment, metrics and checkpoints


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict:
    """Versions and hardware: python, torch, torchvision, DALI, CUDA, cuDNN, GPU names and count, CPUs, hostname."""
    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "dali": _version("nvidia-dali-cuda120") or _version("nvidia-dali-cuda130"),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cpu": platform.processor() or platform.machine(),
        "hostname": socket.gethostname(),
    }


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename, so readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_metrics(path: Path | None, **fields) -> dict:
    """Write `fields` plus `command` and `env` as JSON to `path` (atomically; nothing if `path` is None).

    The scripts pass: script, technique, world_size, batch_size, global_batch, precision, model, dataset, device,
    the Meter summary (images_per_s is made global by the caller), epochs (per-epoch val loss / accuracy and training
    seconds), test_acc, time_to_target_s, train_s, status. Returns the dict written.
    """
    record = {"command": [sys.executable, *sys.argv], **fields, "env": environment()}
    if path is not None:
        atomic_write_text(path, json.dumps(record, indent=2, default=str) + "\n")
    return record


def save_checkpoint(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int, step: int, **extra
) -> None:
    """Save model and optimizer state, the number of finished `epoch`s, the global `step` and any `extra` state
    dicts (scheduler, scaler, ...) to `path`, atomically. Pass the bare model (`model.module` for DP / DDP)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch, "step": step, **extra}, tmp
    )
    os.replace(tmp, path)


def load_checkpoint(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, device: torch.device | str = "cpu"
) -> dict:
    """Load a `save_checkpoint` file into `model` (and `optimizer`); return the whole dict (epoch, step, extras).

    Raises FileNotFoundError if `path` is missing and RuntimeError if the state does not fit the model.
    """
    state = torch.load(path, map_location=device, weights_only=False)
    model.load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    return state

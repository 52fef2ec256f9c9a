"""Fashion-MNIST (found, read, checked) and the synthetic batch already on the device."""

from __future__ import annotations

import argparse
import gzip
import math
import zlib
from pathlib import Path

import numpy as np
import torch

from . import text
from .env import REPO
from .errors import die
from .models import TEXT_MODELS

TEXT_VOCAB = 84  # characters in the Shakespeare corpus (text.check_corpus checks it)
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")  # Debian package `dataset-fashion-mnist`
FASHION_MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}


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
    uint8 array of those sizes. Raises BadDataFile naming the file when it is not gzip, is truncated or damaged (a
    deflate stream zlib cannot decode, a CRC that does not match), has another magic number or holds a different
    number of bytes than its header says."""
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as error:  # zlib.error: bytes damaged inside the deflate stream
        raise BadDataFile(f"{path} is not a readable gzip file ({error})") from None
    if len(raw) < 4 or raw[:3] != b"\x00\x00\x08" or not 1 <= raw[3] <= 4:
        raise BadDataFile(f"{path} is not an IDX file of bytes (magic {raw[:4].hex() or 'missing'}, expected 000008xx)")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    if len(raw) != 4 + 4 * ndim + math.prod(shape):  # exact: np.prod of four 32-bit sizes can overflow int64
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


class SyntheticTokens:
    """The text twin of SyntheticLoader: the same random (batch_size, seq_len) int64 tokens in [0, vocab) and
    targets, already on `device`, `steps` times per pass: the GPT's compute ceiling."""

    def __init__(self, batch_size: int, seq_len: int, steps: int, device: torch.device, vocab: int, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, vocab, (batch_size, seq_len), generator=generator).to(device)
        self.labels = torch.randint(0, vocab, (batch_size, seq_len), generator=generator).to(device)
        self.steps, self.dataset = steps, range(steps * batch_size)

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        for _ in range(self.steps):
            yield self.images, self.labels


class SyntheticLoader:
    """Yields the same random batch (drawn from `seed`), already on `device`, `steps` times per pass: the compute
    ceiling.

    images: float32 (batch_size, channels, image_size, image_size) ~ N(0, 1); labels: int64 (batch_size,) in [0, 10).
    Nothing is decoded or copied per step, so images/s measures the model and the optimizer alone.
    """

    def __init__(
        self, batch_size: int, image_size: int, steps: int, device: torch.device, channels: int = 3, seed: int = 0
    ):
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.randn(batch_size, channels, image_size, image_size, generator=generator).to(device)
        self.labels = torch.randint(0, 10, (batch_size,), generator=generator).to(device)
        self.steps, self.dataset = steps, range(steps * batch_size)  # `dataset` so len(loader.dataset) works

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        for _ in range(self.steps):
            yield self.images, self.labels


def shakespeare_sets(args: argparse.Namespace):
    """(train_set, test_set) of the text at --seq-len (`text.shakespeare`), cut to the training works' first --subset
    blocks and the held-out plays' first --test-subset: what `load_data` hands a script, and the blocks the
    --target-loss probe samples (common/target.py). Raises text.BadCorpus when the corpus is missing or damaged."""
    train_set, test_set = text.shakespeare(args.seq_len)
    if args.subset or getattr(args, "test_subset", None):
        train_set, test_set = (
            torch.utils.data.TensorDataset(*(tensor[:n] for tensor in dataset.tensors))
            for dataset, n in ((train_set, args.subset), (test_set, getattr(args, "test_subset", None)))
        )
    return train_set, test_set


def load_data(args: argparse.Namespace):
    """Return `(train_set, test_set)` for `--dataset fashion-mnist` or `shakespeare`, after checking they fit
    `--batch-size`. Shakespeare: TensorDatasets of (inputs, targets) int64 (N, --seq-len) blocks (`text.shakespeare`),
    the training works' first --subset blocks and the held-out plays' first --test-subset.

    Exits with one line on stderr when the data is missing or the training set is smaller than one batch
    (every epoch drops its last partial batch, so it would run no step). Not for `--dataset synthetic`.
    """
    if args.dataset == "shakespeare":
        try:
            train_set, test_set = shakespeare_sets(args)
        except text.BadCorpus as error:
            die(f"{error}; get it with `{text.SETUP}`")
        if len(train_set) < args.batch_size:
            die(f"--batch-size {args.batch_size} is larger than the {len(train_set)} training blocks; lower it")
        return train_set, test_set
    try:
        folder = find_fashion_mnist(args.data_dir)
    except DataNotFound as error:
        die(str(error))
    try:
        train_set, test_set = fashion_mnist(folder, args.subset)
        if getattr(args, "test_subset", None):
            test_set = torch.utils.data.TensorDataset(*(tensor[: args.test_subset] for tensor in test_set.tensors))
    except BadDataFile as error:
        die(f"{error}; replace the four Fashion-MNIST files (apt-get install --reinstall dataset-fashion-mnist)")
    if len(train_set) < args.batch_size:
        die(
            f"--batch-size {args.batch_size} is larger than the {len(train_set)} training images; "
            "lower --batch-size or raise --subset"
        )
    return train_set, test_set


def synthetic_data(args: argparse.Namespace, device: torch.device, seed: int = 0):
    """Return `(train_loader, test_loader)` of SyntheticLoader for `--dataset synthetic` (3 x S x S, S = 224 default).

    An epoch is `--subset` images (default 10,240) rounded down to whole batches; the test loader yields the same
    fixed random batch twice, so its accuracy measures how well the model memorised that batch (1.0 in the tables),
    not generalisation: these rows are for images/s, and the tables label them synthetic. `seed` draws the batch:
    the data-parallel scripts pass their rank, so that the ranks train on different batches, as they do on real data
    (identical batches on every rank would hide a gradient that is not averaged over the ranks).
    """
    channels, size = input_shape(args)
    steps = max(1, (args.subset or 10_240) // args.batch_size)
    if args.model in TEXT_MODELS:  # (N, T) tokens: `channels` is the vocabulary, `size` the context
        return (
            SyntheticTokens(args.batch_size, size, steps, device, channels, seed),
            SyntheticTokens(args.batch_size, size, 2, device, channels, seed),
        )
    return (
        SyntheticLoader(args.batch_size, size, steps, device, channels, seed),
        SyntheticLoader(args.batch_size, size, 2, device, channels, seed),
    )


def input_shape(args: argparse.Namespace) -> tuple[int, int]:
    """(channels, side) of the images `--dataset` gives: Fashion-MNIST 1 x 28 x 28, synthetic 3 x S x S; for a text
    model (vocabulary size, context): the corpus's 84 characters (or --vocab-size) and --seq-len tokens."""
    if args.model in TEXT_MODELS:
        return getattr(args, "vocab_size", None) or TEXT_VOCAB, args.seq_len
    return (1, 28) if args.dataset == "fashion-mnist" else (3, args.image_size or 224)

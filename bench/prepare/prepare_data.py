"""Write the JPEG ImageFolders that loader.py and loader_DALI.py read, under data/ (ignored by git).

    python bench/prepare/prepare_data.py                                   # both sets, skipped when already complete
    python bench/prepare/prepare_data.py --synthetic-train 20480 --out data

(a) OUT/fashion-mnist-jpeg/{train,val}/<k>_<class>/<index>.jpg: the 60,000 + 10,000 Fashion-MNIST images as 28x28
    greyscale JPEG (quality 95). Real, labelled images; the `<k>_` prefix keeps ImageFolder's sorted class order
    equal to Fashion-MNIST's label order.
(b) OUT/imagenet-synthetic/{train,val}/<k>_class/<index>.jpg: 500x375 RGB JPEG at quality 90, about 100 KB each
    (ImageNet-1k's training JPEGs are of that order: about 400x350 px on average), so decoding costs about what it
    costs on ImageNet.
    A smooth random colour field plus per-pixel noise, tinted per class so a model can learn something; deterministic
    (seeded per file). Always labelled "synthetic" in tables. Default: 5,120 training images (80 steps of 64 for the cpu
    profile). The gpu-full profile's loader rows want 30,720 (`--synthetic-train 30720`: 120 steps of 256 in one epoch,
    so they measure 110 steps after a 10-step warm-up with no epoch boundary inside; about 70 s on 16 cores, 3.1 GB);
    the gpu profile reads no JPEG file, so the set-up never writes them unasked.
Each set gets a `.complete` file with its parameters, written last: an interrupted or different set is redone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

import common  # noqa: E402

FASHION_MNIST_CLASSES = [
    "T-shirt",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle-boot",
]
WIDTH, HEIGHT, QUALITY = 500, 375, 90
NOISE = 22.0  # per-pixel noise (std, 0-255 scale): sets the JPEG size, ~100 KB at quality 90


def synthetic_image(seed: int, label: int, classes: int) -> Image.Image:
    """One 500x375 RGB image: a smooth random colour field, a class tint, and per-pixel noise (uint8)."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, size=(6, 8, 3)).astype(np.float32)
    field = np.asarray(Image.fromarray(coarse.astype(np.uint8)).resize((WIDTH, HEIGHT), Image.BICUBIC), np.float32)
    hue = 2 * np.pi * label / classes
    tint = 40 * np.array([np.cos(hue), np.cos(hue - 2.1), np.cos(hue + 2.1)], np.float32)
    pixels = field * 0.7 + tint + rng.normal(0, NOISE, size=(HEIGHT, WIDTH, 3)).astype(np.float32)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")


def _write_synthetic(job: tuple[Path, int, int, int]) -> int:
    path, seed, label, classes = job
    synthetic_image(seed, label, classes).save(path, quality=QUALITY)
    return path.stat().st_size


def _write_grey(job: tuple[Path, np.ndarray]) -> int:
    path, pixels = job
    Image.fromarray(pixels, "L").save(path, quality=95)
    return path.stat().st_size


def _done(root: Path, params: dict) -> bool:
    marker = root / ".complete"
    return marker.is_file() and json.loads(marker.read_text()).get("params") == params


def _finish(root: Path, params: dict, sizes: list[int]) -> None:
    summary = {"params": params, "files": len(sizes), "mean_kb": sum(sizes) / len(sizes) / 1000}
    common.io.atomic_write_text(root / ".complete", json.dumps(summary, indent=2) + "\n")
    print(f"prepare_data: {root}: {len(sizes)} JPEG files, {summary['mean_kb']:.1f} KB on average", flush=True)


def fashion_mnist_jpeg(out: Path, workers: int) -> Path:
    """Export Fashion-MNIST (train 60,000 -> train/, test 10,000 -> val/) as JPEG files; return the root."""
    root = out / "fashion-mnist-jpeg"
    params = {"quality": 95, "version": 1}
    if _done(root, params):
        print(f"prepare_data: {root} is complete", flush=True)
        return root
    try:
        folder = common.data.find_fashion_mnist()
    except common.data.DataNotFound as error:
        common.die(str(error))
    shutil.rmtree(root, ignore_errors=True)
    jobs = []
    for split, prefix in (("train", "train"), ("val", "t10k")):
        images = common.data.read_idx(folder / f"{prefix}-images-idx3-ubyte.gz")
        labels = common.data.read_idx(folder / f"{prefix}-labels-idx1-ubyte.gz")
        for k, name in enumerate(FASHION_MNIST_CLASSES):
            (root / split / f"{k}_{name}").mkdir(parents=True, exist_ok=True)
        for i, (pixels, label) in enumerate(zip(images, labels, strict=True)):
            jobs.append((root / split / f"{label}_{FASHION_MNIST_CLASSES[label]}" / f"{i:05d}.jpg", pixels))
    with ProcessPoolExecutor(workers) as pool:
        sizes = list(pool.map(_write_grey, jobs, chunksize=512))
    _finish(root, params, sizes)
    return root


def imagenet_synthetic(out: Path, train: int, val: int, classes: int, workers: int) -> Path:
    """Write `train` + `val` synthetic 500x375 JPEG files over `classes` class folders; return the root."""
    root = out / "imagenet-synthetic"
    params = {"train": train, "val": val, "classes": classes, "size": [WIDTH, HEIGHT], "quality": QUALITY,
              "noise": NOISE, "version": 1}  # fmt: skip
    if _done(root, params):
        print(f"prepare_data: {root} is complete", flush=True)
        return root
    shutil.rmtree(root, ignore_errors=True)
    jobs = []
    for split, count, offset in (("train", train, 0), ("val", val, 10**7)):
        for k in range(classes):
            (root / split / f"{k}_class").mkdir(parents=True, exist_ok=True)
        for i in range(count):
            label = i % classes
            jobs.append((root / split / f"{label}_class" / f"{i:06d}.jpg", offset + i, label, classes))
    with ProcessPoolExecutor(workers) as pool:
        sizes = list(pool.map(_write_synthetic, jobs, chunksize=16))
    _finish(root, params, sizes)
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "data", help="where the folders go")
    parser.add_argument(
        "--synthetic-train",
        type=int,
        default=5120,
        help="training images in the synthetic set (the gpu-full profile's loader rows want 30720)",
    )
    parser.add_argument("--synthetic-val", type=int, default=512, help="validation images in the synthetic set")
    parser.add_argument("--classes", type=int, default=10, help="class folders in the synthetic set")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes writing files")
    parser.add_argument("--only", choices=["fashion-mnist", "synthetic"], default=None, help="write one set only")
    args = parser.parse_args()
    for name in ("synthetic_train", "synthetic_val", "classes", "workers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be 1 or more")
    problem = common.output_problem(args.out, is_folder=True)  # before minutes of writing files
    if problem:
        common.die(f"--out {args.out} {problem}")
    if args.only != "synthetic":
        fashion_mnist_jpeg(args.out, args.workers)
    if args.only != "fashion-mnist":
        imagenet_synthetic(args.out, args.synthetic_train, args.synthetic_val, args.classes, args.workers)


if __name__ == "__main__":
    try:
        main()
    except common.io.WriteFailed as error:  # disk full, I/O error: the file named, its previous version left as it was
        print(f"prepare_data.py: error: {error}", file=sys.stderr)
        raise SystemExit(1) from None
    except OSError as error:  # an image (PIL) on a full disk: the set stays unmarked (no .complete), redone next run
        reason = error.strerror or common.errors.first_line(error)
        print(f"prepare_data.py: error: cannot write {error.filename or 'an image'} ({reason})", file=sys.stderr)
        raise SystemExit(1) from None

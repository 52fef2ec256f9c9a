"""The loaders' ImageFolder helpers: the folder checked before any work, files decoded or named when corrupt."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from .errors import BadImage, die, first_line  # BadImage: the type errors.py's hook reports, raised here

# The ImageNet statistics (torchvision's models use them): per-channel mean and std of RGB in [0, 1].
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")  # what image_folders looks for (ImageFolder and DALI also read more types)


def load_rgb(path: str):
    """ImageFolder's `loader`: open `path` with PIL as an RGB image (greyscale is converted to 3 channels).

    Raises BadImage naming the file if it is corrupt, truncated, not an image, or says it has more pixels than PIL
    decodes (twice Image.MAX_IMAGE_PIXELS, 179 million: a damaged header's size, or a decompression bomb).
    """
    from PIL import Image

    try:
        with open(path, "rb") as f, warnings.catch_warnings():
            # a size between PIL's warning (89 M pixels) and its error: decoded (or refused below), not a warning
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(f)
            return image.convert("RGB")  # decodes the whole file: a truncated JPEG fails here
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:  # (the last: no OSError)
        raise BadImage(f"{path} is not a readable image ({first_line(error)}); remove or replace it") from None


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
    how = (
        "run `python bench/prepare/prepare_data.py`, or pass --data-dir ROOT with ROOT/train/<class>/*.jpg and "
        "ROOT/val/..."
    )
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

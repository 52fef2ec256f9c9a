"""loader.py's input pipeline as one NVIDIA DALI graph, and the iterator that hands its batches over like a DataLoader.

Used by loader_DALI.py (float32 CHW batches, sharded by rank) and train_fast.py (float16 NHWC batches, one process).
DALI is an optional install: nothing here imports it until a function runs, so `import common` works without it.

The graph (`image_pipeline`), operator by operator, against loader.py's torchvision steps:

    fn.readers.file            lists root/<class>/* (classes in sorted order, label = the class's index) and reads the
                               files' bytes. shuffle_after_epoch=True (training): every epoch a new permutation of all
                               the files, as DataLoader(shuffle=True); `random_shuffle=True` would instead draw from a
                               1,024-file buffer moving along one shuffled list, so epochs keep nearly the same order.
                               The permutations come from DALI's own shuffle seed, not from `seed`. shard_id /
                               num_shards: each shard takes its part of the same permutation (disjoint shards).
                               pad_last_batch=True: an epoch ends at its shard's last file; the files of a partial
                               batch never start the next epoch.
    fn.decoders.image_random_crop   RandomResizedCrop's crop: decodes only a random region of 8-100 % of the area,
                               aspect 3/4-4/3 (training)
    fn.resize                  that region to image_size x image_size (training); for validation, the shorter side to
                               round(image_size / 0.875) (256 for 224), as transforms.Resize
    fn.random.coin_flip        a 0/1 per image with probability 0.5: RandomHorizontalFlip (training; 0 for validation)
    fn.crop_mirror_normalize   the centre image_size crop (a no-op after the training resize), the flip, and
                               (x - mean) / std with IMAGENET_MEAN / IMAGENET_STD scaled by 255 (DALI normalises
                               0-255 values, ToTensor's would be 0-1); out in `dtype`, CHW (like ToTensor) or HWC

On a GPU (`device.type == "cuda"`) the decoders run "mixed": Huffman decoding on the CPU, the rest (nvJPEG, or the
hardware JPEG decoder where there is one) on the GPU, whose later operators then run there too, labels copied with
it; without one, DALI's CPU-only mode: decoder "cpu" and device_id=None.
"""

import importlib
from pathlib import Path

import torch

from .errors import die
from .images import IMAGENET_MEAN, IMAGENET_STD, find_non_image

INSTALL = "NVIDIA DALI is not installed: pip install nvidia-dali-cuda120 (Linux x86_64; see requirements.txt)"


def require_dali() -> None:
    """Import nvidia.dali; where it is missing, exit 2 with the one line INSTALL (how to get it), no traceback."""
    try:
        importlib.import_module("nvidia.dali.plugin.pytorch")  # and nvidia.dali, its parent
    except ImportError:
        die(INSTALL)


def image_pipeline(
    root: Path,
    training: bool,
    *,
    batch_size: int,
    image_size: int,
    threads: int,
    device: torch.device,
    seed: int,
    shard_id: int = 0,
    num_shards: int = 1,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = False,
):
    """The DALI pipeline (not yet built) over the ImageFolder split `root`: the graph in this module's docstring.

    Outputs per batch of `batch_size`: images `dtype` (float32 or float16), (N, 3, S, S) with S = `image_size` pixels
    (CHW), or (N, S, S, 3) (HWC) with `channels_last`; labels int32 (N, 1), on the GPU under "mixed" decoding.
    `threads`: DALI's CPU threads; `seed`: the crops' and flips' generators (training); `shard_id` of `num_shards`:
    which part of the files this process reads (a rank of the world size). Exits 2 (one line) without DALI.
    """
    require_dali()
    from nvidia.dali import fn, pipeline_def, types

    gpu = device.type == "cuda"
    decoder = "mixed" if gpu else "cpu"  # mixed: Huffman on the CPU, the rest on the GPU (nvJPEG, hardware)
    out_type = {torch.float32: types.FLOAT, torch.float16: types.FLOAT16}[dtype]

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=device.index or 0 if gpu else None)
    def graph():
        files, labels = fn.readers.file(
            file_root=root,
            shard_id=shard_id,
            num_shards=num_shards,
            shuffle_after_epoch=training,
            pad_last_batch=True,
            name="Reader",
        )
        if training:  # RandomResizedCrop, then RandomHorizontalFlip
            images = fn.decoders.image_random_crop(files, device=decoder, output_type=types.RGB, seed=seed)
            images = fn.resize(images, resize_x=image_size, resize_y=image_size)
            mirror = fn.random.coin_flip(probability=0.5, seed=seed)
        else:  # Resize(round(S / 0.875)) + CenterCrop(S)
            images = fn.decoders.image(files, device=decoder, output_type=types.RGB)
            images = fn.resize(images, resize_shorter=round(image_size / 0.875))
            mirror = 0
        images = fn.crop_mirror_normalize(
            images,
            dtype=out_type,
            output_layout="HWC" if channels_last else "CHW",
            crop=(image_size, image_size),
            mean=[255 * m for m in IMAGENET_MEAN],  # DALI normalises 0-255 values
            std=[255 * s for s in IMAGENET_STD],
            mirror=mirror,
        )
        return images, labels.gpu() if gpu else labels

    return graph()


class DALILoader:
    """A DataLoader's interface over a DALI pipeline: `image_pipeline(root, training, **knobs)` behind a
    DALIGenericIterator.

    Yields (images, labels): images `dtype` (N, 3, S, S), with `channels_last` the HWC batch permuted to that shape
    without a copy (NHWC in memory: torch.channels_last); labels int64 (N,); on the GPU under "mixed" decoding, else on
    the CPU. Training drops the last partial batch (like drop_last=True), validation keeps it (every image once).
    `len(loader)`: batches per epoch of this shard; `len(loader.dataset)`: files in `root` (all shards).
    A file DALI cannot decode: exit 2 with one line naming it (DALI's message, else a header scan of `root`).
    Without DALI: exit 2 with the INSTALL line.
    """

    def __init__(self, root: Path, training: bool, *, channels_last: bool = False, **knobs):
        require_dali()
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        self.root, self.channels_last = root, channels_last
        self.pipeline = image_pipeline(root, training, channels_last=channels_last, **knobs)
        self.iterator = DALIGenericIterator(
            self.pipeline,
            ["images", "labels"],
            reader_name="Reader",  # the epoch ends when the reader has read its shard once
            last_batch_policy=LastBatchPolicy.DROP if training else LastBatchPolicy.PARTIAL,
            auto_reset=True,
            prepare_first_batch=False,  # a corrupt first file fails in the loop, where it is named, not here
        )
        self.dataset = range(self.pipeline.epoch_size("Reader"))  # so that len(loader.dataset) counts the files

    def __len__(self) -> int:
        return len(self.iterator)

    def __iter__(self):
        try:
            for batch in self.iterator:
                images, labels = batch[0]["images"], batch[0]["labels"].squeeze(-1).long()
                yield images.permute(0, 3, 1, 2) if self.channels_last else images, labels
        except RuntimeError as error:  # a corrupt file: one line that names it
            named = [line.strip() for line in str(error).splitlines() if "Failed to decode" in line]
            culprit = named[0] if named else f"{find_non_image(self.root) or 'unknown file'} is not an image"
            die(f"DALI cannot decode a file under {self.root}: {culprit}; remove or replace it")

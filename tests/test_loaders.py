"""loader.py (torch DataLoader) and loader_DALI.py (DALI, CPU-only mode here) on real JPEG files, as subprocesses."""

import json
import os
import sys

import pytest
import torch
from conftest import REPO, assert_one_line_error, run, torchrun
from PIL import Image

import common

sys.path.insert(0, str(REPO / "bench" / "prepare"))

import prepare_data  # noqa: E402

SCRIPTS = ["src/loader.py", "src/loader_DALI.py"]
CPU = ["--device", "cpu", "--warmup-steps", "1", "--log-every", "1000"]
COUNTS = [4 + 4 * k for k in range(10)]  # unequal classes: 220 training images, 11 batches of 20


def grey_folder(root, counts, val_per_class=3):
    """An ImageFolder of real Fashion-MNIST test images as 28x28 greyscale JPEGs, `counts[k]` in train/ class k."""
    images = common.data.read_idx(common.data.find_fashion_mnist(download=False) / "t10k-images-idx3-ubyte.gz")
    i = 0
    for split, per_class in (("train", counts), ("val", [val_per_class] * len(counts))):
        for k, n in enumerate(per_class):
            folder = root / split / f"{k:02d}_class"
            folder.mkdir(parents=True)
            for j in range(n):
                Image.fromarray(images[i], "L").save(folder / f"{j:04d}.jpg", quality=95)
                i += 1
    return root


@pytest.fixture(scope="module")
def grey(tmp_path_factory):
    return grey_folder(tmp_path_factory.mktemp("grey"), COUNTS)


@pytest.fixture(scope="module")
def rgb(tmp_path_factory):
    """Eight 500x375 colour JPEGs of the ImageNet-sized synthetic kind in val/ (and train/), two classes."""
    root = tmp_path_factory.mktemp("rgb")
    for split in ("train", "val"):
        for i in range(8):
            folder = root / split / f"{i % 2}_class"
            folder.mkdir(parents=True, exist_ok=True)
            prepare_data.synthetic_image(i, i % 2, 2).save(folder / f"{i:03d}.jpg", quality=90)
    return root


def loader_metrics(script, root, tmp_path, *flags, env=None):
    out = tmp_path / f"{os.path.basename(script)}.{os.getpid()}.{len(list(tmp_path.iterdir()))}.json"
    proc = run(script, *CPU, "--data-dir", root, *flags, "--metrics-out", out, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text()), proc


@pytest.mark.parametrize("script", SCRIPTS)
def test_one_epoch_delivers_every_image_once(script, grey, tmp_path):
    """Both loaders: one epoch is all 220 images, the label multiset is the folder's (unequal classes)."""
    metrics, _ = loader_metrics(
        script, grey, tmp_path, "--loader-only", "--epochs", "1", "--batch-size", "20", "--workers", "2"
    )
    (epoch,) = metrics["epochs"]
    assert epoch["images"] == sum(COUNTS) and epoch["label_counts"] == COUNTS
    assert metrics["steps"] == sum(COUNTS) // 20 and metrics["images_per_s"] > 0
    assert metrics["loader_only"] is True and metrics["dataset"] == grey.name


def _first_val_batch(script, root, size, tmp_path):
    out = tmp_path / f"{os.path.basename(script)}-{root.name}.pt"
    flags = [*CPU, "--data-dir", root, "--image-size", size, "--batch-size", "8", "--loader-only", "--max-steps", "1"]
    proc = run("tests/loader_probe.py", out, script, "--", *flags)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return torch.load(out)


def _best_shift_error(a, b):
    """Per image, mean |a - b| in 0-255 levels, minimised over shifts of b by -1, 0, +1 pixels in x and y."""
    std = torch.tensor(common.IMAGENET_STD).view(1, 3, 1, 1)
    a, b = a * std * 255, b * std * 255
    height, width = a.shape[-2:]
    errors = []
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            ya, yb = slice(max(dy, 0), height + min(dy, 0)), slice(max(-dy, 0), height - max(dy, 0))
            xa, xb = slice(max(dx, 0), width + min(dx, 0)), slice(max(-dx, 0), width - max(dx, 0))
            errors.append((a[..., ya, xa] - b[..., yb, xb]).abs().mean(dim=(1, 2, 3)))
    return torch.stack(errors).min(0).values


@pytest.mark.parametrize("kind, size", [("grey", 32), ("rgb", 224)])
def test_evaluation_pipelines_agree_on_the_same_files(kind, size, request, tmp_path):
    """Resize (shorter side to size/0.875) + centre crop + normalise: torchvision and DALI give the same pixels.

    Tolerance, 1.5 levels of 255 mean absolute difference per image, with a 1-pixel shift allowed: both decode with
    libjpeg-turbo (bit-identical here); their antialiased bilinear resizes differ by < 1 level on average (0.2 on
    the greyscale, 0.55 on the noisy colour images, measured); and the centre-crop offset (W - S) / 2 is rounded half
    to even by torchvision and half up by DALI, so for odd W - S the crops start one pixel apart. A wrong mean/std,
    swapped channels, a mirror or a different crop size gives tens of levels.
    """
    root = request.getfixturevalue(kind)
    torch_batch, dali_batch = (_first_val_batch(script, root, size, tmp_path) for script in SCRIPTS)
    for batch in (torch_batch, dali_batch):
        assert batch["images"].shape == (8, 3, size, size) and batch["images"].dtype == torch.float32
    assert torch.equal(torch_batch["labels"], dali_batch["labels"])  # same files, same sorted order
    assert _best_shift_error(torch_batch["images"], dali_batch["images"]).max() < 1.5


def test_greyscale_jpegs_come_out_as_three_equal_channels(grey, tmp_path):
    mean, std = torch.tensor(common.IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(common.IMAGENET_STD).view(1, 3, 1, 1)
    for script in SCRIPTS:
        pixels = _first_val_batch(script, grey, 32, tmp_path)["images"] * std + mean
        assert pixels.shape[1] == 3
        assert torch.allclose(pixels[:, 0], pixels[:, 1], atol=1e-5) and torch.allclose(
            pixels[:, 1], pixels[:, 2], atol=1e-5
        )


def test_dali_under_torchrun_reads_disjoint_shards_and_rank_0_writes_the_sum(tmp_path):
    """24 classes of one file each, so a label names a file: 2 ranks read 12 files each, the label counts summed over
    the ranks are all 1 (disjoint, and together every file), rank 0 alone prints and writes, images/s is the sum."""
    root = grey_folder(tmp_path / "one-per-class", [1] * 24, val_per_class=1)
    out = tmp_path / "m.json"
    proc = torchrun(
        "--standalone", "--nproc-per-node", "2", "--log-dir", tmp_path / "logs", "--redirects", "3",
        "src/loader_DALI.py", *CPU, "--data-dir", root, "--loader-only", "--epochs", "1", "--batch-size", "4",
        "--warmup-steps", "0", "--metrics-out", out, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    metrics = json.loads(out.read_text())
    assert metrics["world_size"] == 2 and metrics["epochs"][0]["label_counts"] == [1] * 24
    assert metrics["steps"] == 3  # 12 files per rank, batches of 4
    per_rank = metrics["images_per_s_per_rank"]
    assert len(per_rank) == 2 and all(r > 0 for r in per_rank)
    assert metrics["images_per_s"] == pytest.approx(sum(per_rank))
    stdout = {r: "".join(p.read_text() for p in (tmp_path / "logs").glob(f"**/{r}/stdout.log")) for r in (0, 1)}
    assert "images/s" in stdout[0] and stdout[1].strip() == ""


def test_dali_under_torchrun_without_loader_only_is_refused(tmp_path):
    root = grey_folder(tmp_path / "g", [4] * 10)
    proc = torchrun("--standalone", "--nproc-per-node", "1", "src/loader_DALI.py", *CPU, "--data-dir", root,
                    "--epochs", "1", "--batch-size", "4", timeout=300)  # fmt: skip
    assert proc.returncode == 0  # one process: nothing to shard
    proc = torchrun("--standalone", "--nproc-per-node", "2", "src/loader_DALI.py", *CPU, "--data-dir", root,
                    "--epochs", "1", "--batch-size", "4", timeout=300)  # fmt: skip
    assert proc.returncode != 0 and "add --loader-only" in proc.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_trains_end_to_end_from_the_files(script, tmp_path):
    """60 steps of the small CNN on the Fashion-MNIST JPEGs written by bench/prepare/prepare_data.py: well above
    chance."""
    root = REPO / "data" / "fashion-mnist-jpeg"
    if not (root / ".complete").exists():
        pytest.fail("the test set-up (bench/setup.sh) should have run bench/prepare/prepare_data.py")
    metrics, _ = loader_metrics(script, root, tmp_path, "--max-steps", "60", "--batch-size", "64", "--workers", "2")
    assert metrics["test_images"] == 10_000 and metrics["test_acc"] > 0.4  # chance is 0.1
    assert metrics["epochs"][0]["train_loss"] < 2.3


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("damage", ["truncated", "not an image"])
def test_a_corrupt_file_is_one_line_naming_it(script, damage, grey, tmp_path):
    root = tmp_path / "damaged"
    for split in ("train", "val"):
        (root / split / "0_class").mkdir(parents=True)
        for i in range(8):
            (root / split / "0_class" / f"{i}.jpg").write_bytes((grey / split / "00_class" / "0000.jpg").read_bytes())
    good = (grey / "train" / "00_class" / "0000.jpg").read_bytes()
    bad = good[: len(good) // 2] if damage == "truncated" else b"name,size\nnot,an image\n"
    (root / "train" / "0_class" / "bad.jpg").write_bytes(bad)
    proc = run(script, *CPU, "--data-dir", root, "--batch-size", "3", "--epochs", "1", "--workers", "2", timeout=120)
    assert_one_line_error(proc, "bad.jpg")


@pytest.mark.parametrize("script", SCRIPTS)
def test_bad_folders_are_one_line(script, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "no-images" / "train" / "a").mkdir(parents=True)
    (tmp_path / "no-images" / "val" / "a").mkdir(parents=True)
    (tmp_path / "no-images" / "train" / "a" / "notes.txt").write_text("no image here")
    cases = {
        tmp_path / "missing": "does not exist",
        tmp_path / "empty": "is empty",
        tmp_path / "no-images": "has no class folder with",
    }
    for folder, message in cases.items():
        assert_one_line_error(run(script, *CPU, "--data-dir", folder), message, "prepare_data.py")


@pytest.mark.parametrize("script", SCRIPTS)
def test_batch_larger_than_the_folder_is_refused(script, grey):
    proc = run(script, *CPU, "--data-dir", grey, "--batch-size", "1000")
    assert_one_line_error(proc, "--batch-size 1000 is larger than the 220 images")


def test_loader_dali_without_dali_says_how_to_install(grey, tmp_path):
    """A stand-in `nvidia` package earlier on the path hides the real DALI, as on a machine without it. The folder is
    a real one: DALILoader says it, after the folder's own checks."""
    shim = tmp_path / "shim" / "nvidia" / "dali"
    shim.mkdir(parents=True)
    (shim.parent / "__init__.py").write_text("")
    (shim / "__init__.py").write_text("raise ImportError('No module named nvidia.dali')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "shim")}
    proc = run("src/loader_DALI.py", *CPU, "--data-dir", grey, "--loader-only", env=env)
    assert_one_line_error(proc, "NVIDIA DALI is not installed", "pip install nvidia-dali-cuda120")


@pytest.mark.gpu
def test_dali_mixed_decoding_on_cuda(tmp_path):
    root = REPO / "data" / "imagenet-synthetic"
    metrics, proc = loader_metrics(
        "src/loader_DALI.py", root, tmp_path, "--device", "cuda", "--image-size", "224", "--loader-only",
        "--batch-size", "128", "--threads", "4", "--max-steps", "20",
    )  # fmt: skip
    assert metrics["loader"] == "DALI mixed" and metrics["images_per_s"] > 0
    assert "CPU-only mode" not in proc.stdout

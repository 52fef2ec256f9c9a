"""Bad input at every entry point: one line on stderr that says what is wrong and how to fix it, a non-zero exit,
no traceback, no hang (each case is a real subprocess with a timeout).

Cases already covered next to their feature: train.py's parser values, missing --data-dir and --subset smaller
than a batch (test_common.py); the loaders' missing / empty / image-less folders, corrupt and non-image files,
batch larger than the folder and DALI not installed (test_loaders.py); DDP without torchrun
(test_variants.py); the bench's unknown profile and --repeats 0 (test_bench.py). Outputs that cannot be written,
checkpoints --resume cannot continue, a bad bench matrix, metrics that cannot be written at the end and a checkpoint
writer killed mid-write: test_faults.py.
"""

import subprocess
import sys

import pytest
import torch
import conftest
from conftest import REPO, assert_one_line_error, run

TRAIN = [
    "src/train.py",
    "src/train_DP.py",
    "src/train_amp.py",
    "src/train_channels_last.py",
    "src/train_compile.py",
    "src/train_fast.py",
    "src/train_model_parallel.py",
]
DISTRIBUTED = ["src/train_DDP.py", "src/train_DDP_elastic.py", "src/train_accum.py"]  # need torchrun
ALL = [*TRAIN, *DISTRIBUTED, "src/loader.py", "src/loader_DALI.py"]
CPU = ["--device", "cpu", "--workers", "0"]
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")


def torchrun(*argv, timeout=300):
    """torchrun with one process; its agent prints its own failure report after the worker's one-line error."""
    return conftest.torchrun("--standalone", "--nproc-per-node", "1", *argv, timeout=timeout)


def assert_worker_error(proc, *fragments):
    """Under torchrun: non-zero exit, the script's one error line, and no traceback from the project's code."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "train_DDP.py: error: " in line]
    assert lines, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert 'src/train_DDP.py", line' not in proc.stderr and "src/common/" not in proc.stderr


USAGE = [
    (["--batch-size", "0"], "argument --batch-size: must be a positive integer, got 0"),
    (["--epochs", "-1"], "argument --epochs: must be a positive integer, got -1"),
    (["--lr", "0"], "argument --lr: must be a positive number, got 0"),
    (["--model", "vgg16"], "argument --model: invalid choice: 'vgg16'"),
]


@pytest.mark.parametrize("script", [s for s in ALL if s != "src/train.py"])  # train.py: test_common.py
def test_non_positive_numbers_and_unknown_models_are_usage_errors(script):
    """Each script refuses one of the four kinds (they share one parser; train.py is checked for all of them)."""
    flags, fragment = USAGE[ALL.index(script) % len(USAGE)]
    proc = run(script, *CPU, *flags, timeout=120)
    assert proc.returncode == 2
    assert_one_line_error(proc, fragment)


@pytest.mark.parametrize("script", ["src/train_DP.py", "src/train_fast.py"])  # train.py: test_common.py
def test_missing_data_dir_is_one_line(script, tmp_path):
    proc = run(script, *CPU, "--data-dir", tmp_path / "nope", timeout=120)
    assert_one_line_error(proc, f"--data-dir {tmp_path / 'nope'} does not exist", "apt-get install")


@pytest.mark.parametrize("script", ["src/train.py", "src/train_channels_last.py"])  # one common.load_data for all
def test_data_dir_without_fashion_mnist_is_one_line(script, tmp_path):
    """An empty folder, and a folder of other files: both name the four files it lacks and how to get them."""
    assert_one_line_error(run(script, *CPU, "--data-dir", tmp_path, timeout=120), "lacks the Fashion-MNIST files")
    (tmp_path / "notes.txt").write_text("not a dataset")
    (tmp_path / "picture.jpg").write_bytes(b"\xff\xd8\xff")
    proc = run(script, *CPU, "--data-dir", tmp_path, timeout=120)
    assert_one_line_error(proc, "lacks the Fashion-MNIST files", "train-images-idx3-ubyte.gz")


@pytest.mark.parametrize("script", ["src/train_amp.py", "src/train_model_parallel.py"])  # train.py: test_common.py
def test_subset_smaller_than_one_batch_is_refused(script):
    proc = run(script, *CPU, "--subset", "100", "--batch-size", "128", timeout=120)
    assert_one_line_error(proc, "--batch-size 128 is larger than the 100 training images", "raise --subset")


@no_cuda
# every script asks common.get_device first; these four also import DALI or place stages on devices of their own
@pytest.mark.parametrize(
    "script", ["src/train.py", "src/train_fast.py", "src/train_model_parallel.py", "src/loader_DALI.py"]
)
def test_device_cuda_without_cuda_is_one_line(script):
    proc = run(script, "--device", "cuda", "--epochs", "1", timeout=120)
    assert_one_line_error(proc, "--device cuda was given but torch sees no CUDA GPU", "use --device cpu")


def test_async_checkpoint_without_a_checkpoint_dir_is_one_line():
    proc = run("src/train_async_checkpoint.py", "--device", "cpu", timeout=120)
    assert_one_line_error(proc, "writes checkpoints: give --checkpoint-dir", "the folder")


def test_regional_compile_of_a_model_without_repeated_blocks_is_one_line():
    proc = run("src/train_compile.py", "--compile-regions", "--model", "mlp", "--max-steps", "1", timeout=120)
    assert_one_line_error(proc, "--compile-regions compiles repeated transformer blocks", "not mlp")


@no_cuda
def test_ddp_device_cuda_without_cuda_is_one_line_from_the_worker():
    proc = torchrun("src/train_DDP.py", "--device", "cuda", "--subset", "1024")
    assert_worker_error(proc, "--device cuda was given but torch sees no CUDA GPU")


def test_ddp_missing_data_dir_is_one_line_from_the_worker(tmp_path):
    proc = torchrun("src/train_DDP.py", *CPU, "--data-dir", tmp_path / "nope")
    assert_worker_error(proc, "does not exist")


@pytest.mark.parametrize("script", ["src/loader.py", "src/loader_DALI.py"])
def test_a_flag_a_script_ignores_is_not_accepted(script):
    proc = run(script, *CPU, "--clip-grad-norm", "1.0", timeout=120)
    assert proc.returncode == 2
    assert_one_line_error(proc, "unrecognized arguments: --clip-grad-norm")


def test_help_shows_defaults_units_and_the_run_lines():
    proc = run("src/train_amp.py", "--help", timeout=120)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "(default: cnn)" in text and "passes over the training set (default per model: gpt 1, the others 2)" in text
    assert "per process per step (default per model: gpt 16, the others 128)" in text
    # Each default said once: none where the help text already names it, none for "no value" or an off switch.
    assert "(default: None)" not in proc.stdout and "(default: False)" not in proc.stdout
    assert " ".join(proc.stdout.split()).count("Fashion-MNIST is always 1 x 28 x 28 (default") == 0
    assert proc.stdout.rstrip().endswith(
        "diff src/train.py src/train_amp.py                        # only the lines marked `# new #`"
    )


def test_importing_common_changes_nothing_global():
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, 'src'); import common; "
         "assert sys.excepthook is sys.__excepthook__"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_out_of_memory_is_one_line_with_advice():
    """A batch of 64 synthetic 3 x 30000 x 30000 images (691 GB) cannot be allocated: exit 3, not a traceback."""
    proc = run("src/train.py", *CPU, "--dataset", "synthetic", "--image-size", "30000", "--batch-size", "64")
    assert proc.returncode == 3
    assert_one_line_error(proc, "out of memory", "lower --batch-size")


def test_bench_unreadable_matrix_and_unknown_rows_are_one_line(tmp_path):
    proc = run("bench/bench.py", "--matrix", tmp_path / "missing.toml", "--out", tmp_path / "o", timeout=120)
    assert proc.returncode == 2
    assert_one_line_error(proc, "cannot read the matrix")
    (tmp_path / "broken.toml").write_text("[smoke\nruns = ")
    proc = run("bench/bench.py", "--matrix", tmp_path / "broken.toml", "--profile", "smoke", timeout=120)
    assert_one_line_error(proc, "cannot read the matrix")
    proc = run("bench/bench.py", "--profile", "smoke", "--only", "no-such-row", timeout=120)
    assert proc.returncode == 2
    assert_one_line_error(proc, "no configuration of profile 'smoke' matches --only no-such-row")


def test_run_all_with_a_bad_flag_is_one_line():
    """run_all.sh's set-up finds everything installed, then the bench refuses the profile in one line."""
    proc = subprocess.run(
        ["bash", "run_all.sh", "--profile", "no-such-profile"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 2
    assert_one_line_error(proc, "profile 'no-such-profile' is not in")


@pytest.mark.parametrize("damage", ["truncated", "foreign", "labels"])
def test_a_damaged_fashion_mnist_file_is_one_line_naming_it(damage, fmnist_dir, tmp_path):
    import gzip
    import shutil

    for name in ("train-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(fmnist_dir / name, tmp_path / name)
    labels = gzip.decompress((fmnist_dir / "train-labels-idx1-ubyte.gz").read_bytes())
    if damage == "truncated":
        data = gzip.compress(labels)[:-100]  # the end of the gzip stream is missing
    elif damage == "foreign":
        data = gzip.compress(b"PK\x03\x04" + labels[4:])  # another file format under the right name
    else:
        data = gzip.compress(labels[:-1] + b"\x0c")  # the last label is 12
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(data)
    proc = run("src/train.py", *CPU, "--data-dir", tmp_path, timeout=120)
    assert proc.returncode == 2
    assert_one_line_error(proc, "train-labels-idx1-ubyte.gz", "replace the four Fashion-MNIST files")

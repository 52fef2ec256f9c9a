"""train_channels_last.py, train_compile.py, train_accum.py, train_model_parallel.py and train_fast.py on real
Fashion-MNIST (and real JPEG files for train_fast.py), as real subprocesses: each does what its technique promises."""

import json
import os
import subprocess
import sys

import pytest
import torch
import conftest
from conftest import REPO, assert_one_line_error, cpu_has_native_bfloat16, run

import common

QUICK = ["--device", "cpu", "--model", "cnn", "--workers", "0", "--warmup-steps", "3", "--log-every", "1000",
         "--test-subset", "500"]  # fmt: skip


def torchrun(nproc, *argv, timeout=600):
    return conftest.torchrun("--standalone", "--nproc-per-node", nproc, *argv, timeout=timeout)


def metrics_of(tmp_path, script, *flags, name="m.json"):
    proc = run(script, *flags, "--metrics-out", tmp_path / name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((tmp_path / name).read_text()), proc


# -- channels_last ------------------------------------------------------------------------------------------------


PROBE = """
import runpy, sys
import torch.nn as nn
sys.path.insert(0, "src")
import common

class BackToNCHW(nn.Module):  # what a .contiguous() or .reshape in a model does to the layout
    def forward(self, x):
        return x.contiguous()

common.build_model = lambda *a, **k: nn.Sequential(
    nn.Conv2d(1, 8, 3), BackToNCHW(), nn.Conv2d(8, 8, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)
)
sys.argv = ["src/train_channels_last.py", *sys.argv[1:]]
runpy.run_path("src/train_channels_last.py", run_name="__main__")
"""


def test_channels_last_refuses_a_model_that_turns_activations_back_to_nchw():
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *QUICK, "--subset", "512"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert_one_line_error(proc, "input is not channels_last", "turned it back to NCHW")


# -- torch.compile ------------------------------------------------------------------------------------------------


def test_compile_without_a_cxx_compiler_on_cpu_is_one_line():
    proc = run("src/train_compile.py", *QUICK, "--subset", "512", env={**os.environ, "CXX": "/nonexistent/g++"})
    assert_one_line_error(proc, "torch.compile on CPU needs a C++ compiler", "/nonexistent/g++ not found")


def test_compile_unknown_mode_is_a_usage_error():
    proc = run("src/train_compile.py", *QUICK, "--compile-mode", "fastest")
    assert proc.returncode == 2
    assert_one_line_error(proc, "argument --compile-mode: invalid choice: 'fastest'")


# -- gradient accumulation ----------------------------------------------------------------------------------------

ACCUM = ["src/train_accum.py", "--device", "cpu", "--model", "mlp", "--workers", "0", "--subset", "1024",
         "--warmup-steps", "0", "--log-every", "1000"]  # fmt: skip


def _first_step(tmp_path, name, batch, accum):
    out = tmp_path / name
    proc = torchrun(1, *ACCUM, "--batch-size", batch, "--accum-steps", accum, "--max-steps", "1",
                    "--checkpoint-dir", out, "--metrics-out", out / "m.json")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return torch.load(out / "last.pt", weights_only=False), json.loads((out / "m.json").read_text())


def test_accum_steps_zero_and_too_many_are_refused():
    proc = torchrun(1, *ACCUM, "--accum-steps", "0")
    assert proc.returncode != 0 and "argument --accum-steps: must be a positive integer, got 0" in proc.stderr
    proc = torchrun(1, *ACCUM, "--batch-size", "512", "--accum-steps", "4")
    assert proc.returncode != 0 and "--accum-steps 4 is more than the 2 micro-batches of an epoch" in proc.stderr


# -- model parallelism --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("micro", ["3", "256"])
def test_micro_batches_that_do_not_divide_the_batch_are_refused(micro):
    proc = run("src/train_model_parallel.py", *QUICK, "--batch-size", "128", "--micro-batches", micro)
    assert proc.returncode == 2
    assert_one_line_error(proc, f"--micro-batches {micro} must divide --batch-size 128")


# -- everything stacked -------------------------------------------------------------------------------------------


def test_fast_trains_from_jpeg_files_in_dali_cpu_mode(tmp_path):
    """1,000 training and 300 validation files of the real Fashion-MNIST JPEGs (links into data/), 40 steps."""
    source, root = REPO / "data" / "fashion-mnist-jpeg", tmp_path / "jpeg"
    for split, count in (("train", 100), ("val", 30)):
        for folder in sorted((source / split).iterdir()):
            (root / split / folder.name).mkdir(parents=True)
            for path in sorted(folder.glob("*.jpg"))[:count]:
                (root / split / folder.name / path.name).symlink_to(path)
    flags = ["--device", "cpu", "--model", "cnn", "--dataset", "imagefolder", "--data-dir", root, "--image-size", "32",
             "--batch-size", "64", "--max-steps", "40", "--threads", "2", "--warmup-steps", "3", "--log-every", "1000"]  # fmt: skip
    metrics, _ = metrics_of(tmp_path, "src/train_fast.py", *flags)
    assert metrics["loader"] == "DALI cpu" and metrics["dataset"] == "imagefolder"
    assert metrics["test_images"] == 300 and metrics["test_acc"] > 0.3  # chance is 0.1
    native = cpu_has_native_bfloat16()  # bfloat16 autocast where native, else float32 batches and no autocast
    assert metrics["epochs"][0]["logits_dtype"] == ("torch.bfloat16" if native else "torch.float32")


def test_fast_a_corrupt_image_file_is_one_line_naming_it(tmp_path):
    """DALI reports a failed decode without the file's name: the script names it (a folder without train/ and the
    like are common.image_folders' checks, tested with the loaders)."""
    flags = ["--device", "cpu", "--dataset", "imagefolder", "--batch-size", "2", "--epochs", "1"]
    root = tmp_path / "damaged"
    good = (REPO / "data" / "fashion-mnist-jpeg" / "val" / "0_T-shirt").glob("*.jpg")
    for split in ("train", "val"):
        (root / split / "0_class").mkdir(parents=True)
        for i, path in zip(range(6), good, strict=False):
            (root / split / "0_class" / f"{i}.jpg").write_bytes(path.read_bytes())
    (root / "train" / "0_class" / "bad.jpg").write_bytes(b"name,size\nnot,an image\n")
    proc = run("src/train_fast.py", *flags, "--data-dir", root, "--threads", "1", "--warmup-steps", "0")
    assert_one_line_error(proc, "bad.jpg")


def test_fast_batch_that_does_not_fit_in_memory_is_exit_3():
    proc = run("src/train_fast.py", "--device", "cpu", "--dataset", "synthetic", "--image-size", "30000",
               "--batch-size", "64")  # fmt: skip
    assert proc.returncode == 3
    assert_one_line_error(proc, "out of memory", "lower --batch-size")


def test_fast_is_a_single_process_script_and_refuses_a_world_size_above_1():
    """Under torchrun with 2 processes it used to train 2 independent models on disjoint shards: now one line."""
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}  # what torchrun sets for each worker
    proc = run("src/train_fast.py", *QUICK, "--subset", "512", env=env)
    assert proc.returncode == 2
    assert_one_line_error(proc, "train_fast.py is a single-process script", "train_DDP.py")


# -- --model vit in every single-process training script ----------------------------------------------------------


@pytest.mark.parametrize(
    "script", ["train_DP.py", "train_amp.py", "train_channels_last.py", "train_compile.py", "train_fast.py"]
)
def test_every_single_process_script_trains_the_vit(script, tmp_path):
    """--model vit through each single-process script (train.py, train_activation_checkpointing.py and
    train_model_parallel.py have their own tests in test_equivalence.py): 2 steps of the small ViT on synthetic
    3 x 32 x 32 batches, which run its 17-token encoder; channels_last checks its one convolution (the patch
    embedding) reads NHWC. The metrics name the model and carry its parameters and the activations it kept."""
    flags = ["--device", "cpu", "--model", "vit", "--dataset", "synthetic", "--image-size", "32", "--subset", "64",
             "--batch-size", "32", "--epochs", "1", "--warmup-steps", "1", "--workers", "0"]  # fmt: skip
    metrics, proc = metrics_of(tmp_path, f"src/{script}", *flags)
    assert metrics["model"] == "vit" and metrics["steps"] == 2 and metrics["status"] == "ok"
    vit = common.build_model("vit", 3, 32)
    assert metrics["activation_mib"] > 0 and metrics["params"] == sum(p.numel() for p in vit.parameters())
    assert "activations saved for backward" in proc.stdout


def test_vit_image_side_that_is_not_a_multiple_of_its_patch_is_a_usage_error():
    proc = run("src/train.py", "--device", "cpu", "--model", "vit", "--dataset", "synthetic", "--image-size", "30")
    assert_one_line_error(proc, "--model vit cuts images into 7 px patches: --image-size 30 is not a multiple")
    assert proc.returncode == 2


def test_fsdp_bfloat16_with_batchnorm_is_a_usage_error():
    """BatchNorm's float32 running statistics do not run with FSDP's bfloat16 parameters: refused before launching."""
    proc = run("src/train_FSDP.py", "--device", "cpu", "--model", "resnet18", "--param-dtype", "bfloat16")
    assert_one_line_error(proc, "--param-dtype bfloat16 needs a model without BatchNorm (vit, mlp), not resnet18")
    assert proc.returncode == 2

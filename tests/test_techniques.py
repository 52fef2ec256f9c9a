"""train_channels_last.py, train_compile.py, train_accum.py, train_model_parallel.py and train_fast.py on real
Fashion-MNIST (and real JPEG files for train_fast.py), as real subprocesses: each does what its technique promises."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO, assert_loads_into_train_py, assert_one_line_error, run

QUICK = ["--device", "cpu", "--model", "cnn", "--workers", "0", "--warmup-steps", "3", "--log-every", "1000"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


def torchrun(nproc, *argv, timeout=600):
    return subprocess.run(
        [*TORCHRUN, "--nproc-per-node", str(nproc), *map(str, argv)], cwd=REPO, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def metrics_of(tmp_path, script, *flags, name="m.json"):
    proc = run(script, *flags, "--metrics-out", tmp_path / name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((tmp_path / name).read_text()), proc


# -- channels_last ------------------------------------------------------------------------------------------------


def test_channels_last_trains_with_nhwc_weights(tmp_path):
    metrics, _ = metrics_of(
        tmp_path,
        "src/train_channels_last.py",
        *QUICK,
        "--subset",
        "1024",
        "--epochs",
        "1",
        "--checkpoint-dir",
        tmp_path,
    )
    assert metrics["technique"] == "channels_last" and metrics["precision"] == "amp bfloat16 + channels_last"
    assert metrics["test_acc"] > 0.3  # 8 steps on 1,024 images; chance is 0.1
    weight = torch.load(tmp_path / "last.pt", weights_only=False)["model"]["4.weight"]  # the second convolution
    assert weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()


PROBE = """
import runpy, sys
import torch.nn as nn
sys.path.insert(0, "src")
import common

class BackToNCHW(nn.Module):  # what a .view or permute in a model does to the layout
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


def test_compile_reports_compile_time_apart_and_saves_a_plain_checkpoint(tmp_path):
    flags = [*QUICK, "--subset", "1024", "--epochs", "1", "--checkpoint-dir", tmp_path, "--target-acc", "0.2"]
    metrics, _ = metrics_of(tmp_path, "src/train_compile.py", *flags)
    assert metrics["technique"] == "compile" and metrics["compile_mode"] == "default"
    assert metrics["compile_s"] > 0 and metrics["compile_s"] == metrics["first_step_s"]
    assert metrics["measured_steps"] == 8 - 3 and metrics["images_per_s"] > 0  # the compile is a warm-up step
    assert metrics["compile_s"] > metrics["step_ms_p50"] / 1e3  # the first step also traces, compiles (or loads)
    reached = metrics["time_to_target_incl_compile_s"]
    assert reached == pytest.approx(metrics["time_to_target_s"] + metrics["compile_s"])
    assert_loads_into_train_py(tmp_path / "last.pt")  # the eager module was saved: no "_orig_mod." prefix


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


def test_four_micro_batches_of_32_make_the_step_of_one_batch_of_128(tmp_path):
    """Same data (the same sampler order), a model without batch statistics: after one optimizer step the weights and
    AdamW's first moment (0.1 x the gradient it used) equal those of one step on the whole batch."""
    accumulated, metrics = _first_step(tmp_path, "accum", 32, 4)
    whole, _ = _first_step(tmp_path, "whole", 128, 1)
    assert metrics["global_batch"] == 128 and metrics["accum_steps"] == 4 and metrics["steps"] == 1
    for key, value in whole["model"].items():
        assert torch.allclose(accumulated["model"][key], value, atol=1e-6), key
    moments = [(a["exp_avg"], w["exp_avg"]) for a, w in zip(accumulated["optimizer"]["state"].values(),
                                                             whole["optimizer"]["state"].values(), strict=True)]  # fmt: skip
    for a, w in moments:
        assert w.abs().max() > 0 and torch.allclose(a, w, rtol=1e-4, atol=1e-7)  # the same gradient, not K times it


def test_no_sync_all_reduces_once_per_optimizer_step_instead_of_k_times(tmp_path):
    flags = [*ACCUM, "--batch-size", "32", "--accum-steps", "4", "--max-steps", "3"]
    proc = torchrun(2, *flags, "--metrics-out", tmp_path / "no_sync.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = torchrun(2, *flags, "--all-reduce-every-micro-batch", "--metrics-out", tmp_path / "every.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    no_sync, every = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("no_sync", "every"))
    assert no_sync["allreduces_per_step"] == 1.0  # one gradient bucket, once per optimizer step
    assert every["allreduces_per_step"] == 4.0  # once per micro-batch
    assert no_sync["global_batch"] == 32 * 4 * 2 and no_sync["world_size"] == 2


def test_accum_steps_zero_and_too_many_are_refused():
    proc = torchrun(1, *ACCUM, "--accum-steps", "0")
    assert proc.returncode != 0 and "argument --accum-steps: must be a positive integer, got 0" in proc.stderr
    proc = torchrun(1, *ACCUM, "--batch-size", "512", "--accum-steps", "4")
    assert proc.returncode != 0 and "--accum-steps 4 is more than the 2 micro-batches of an epoch" in proc.stderr


# -- model parallelism --------------------------------------------------------------------------------------------


def test_model_parallel_on_one_device_says_so_and_its_checkpoint_loads_into_train_py(tmp_path):
    flags = [*QUICK, "--subset", "1024", "--epochs", "1", "--micro-batches", "4", "--checkpoint-dir", tmp_path]
    metrics, proc = metrics_of(tmp_path, "src/train_model_parallel.py", *flags)
    assert "model parallelism needs 2 GPUs, 0 visible: both stages on cpu" in proc.stdout
    assert metrics["technique"] == "model parallel" and metrics["stages"] == ["cpu", "cpu"]
    assert metrics["micro_batches"] == 4 and metrics["test_acc"] > 0.3 and metrics["test_images"] == 10_000
    assert_loads_into_train_py(tmp_path / "last.pt")  # the stages share the model's layers and keys


def test_pipelined_micro_batches_give_the_whole_batch_s_logits():
    """The split-batch pipeline is the same function as the model, for a model without batch statistics."""
    probe = (
        "import runpy, sys, torch; sys.argv = ['src/train_model_parallel.py', *sys.argv[1:]]; "
        "g = runpy.run_path('src/train_model_parallel.py', run_name='__main__'); "
        "x = torch.randn(64, 1, 28, 28); g['model'].eval(); g['pipeline'].eval(); "
        "assert torch.allclose(g['pipeline'](x), g['model'](x), atol=1e-5); print('SAME')"
    )
    flags = ["--device", "cpu", "--model", "mlp", "--subset", "256", "--epochs", "1", "--batch-size", "64",
             "--micro-batches", "8", "--workers", "0"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", probe, *flags], cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )  # fmt: skip
    assert proc.returncode == 0 and "SAME" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("micro", ["3", "256"])
def test_micro_batches_that_do_not_divide_the_batch_are_refused(micro):
    proc = run("src/train_model_parallel.py", *QUICK, "--batch-size", "128", "--micro-batches", micro)
    assert proc.returncode == 2
    assert_one_line_error(proc, f"--micro-batches {micro} must divide --batch-size 128")


# -- everything stacked -------------------------------------------------------------------------------------------


def test_fast_trains_fashion_mnist_held_on_the_device(tmp_path):
    flags = [*QUICK, "--subset", "1536", "--epochs", "1", "--batch-size", "128"]
    metrics, proc = metrics_of(tmp_path, "src/train_fast.py", *flags)
    assert "train_fast.py: no GPU:" in proc.stdout  # says what it cannot do here
    assert metrics["technique"] == "everything stacked" and metrics["compile_s"] > 0
    assert metrics["test_acc"] > 0.4 and metrics["test_images"] == 10_000  # chance is 0.1
    assert metrics["data_wait_frac"] < 0.05  # no DataLoader: batches are cut from memory


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
    assert metrics["epochs"][0]["logits_dtype"] == "torch.bfloat16"


def test_fast_bad_image_folders_are_one_line(tmp_path):
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.jpg").write_bytes(b"\xff\xd8\xff")
    flags = ["--device", "cpu", "--dataset", "imagefolder", "--batch-size", "2", "--epochs", "1"]
    proc = run("src/train_fast.py", *flags, "--data-dir", tmp_path / "flat")
    assert_one_line_error(proc, "has no train/ folder")
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

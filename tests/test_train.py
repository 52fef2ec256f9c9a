"""train.py on real Fashion-MNIST, as real subprocesses: it learns, writes complete metrics, and resumes."""

import json
import re
import subprocess
import time

import pytest
import torch
from conftest import stopped_after_first_checkpoint, REPO, run

QUICK = [
    "--device",
    "cpu",
    "--model",
    "cnn",
    "--subset",
    "4096",
    "--batch-size",
    "128",
    "--workers",
    "0",
    "--warmup-steps",
    "5",
    "--log-every",
    "8",
]


@pytest.fixture(scope="module")
def two_epochs(tmp_path_factory):
    out = tmp_path_factory.mktemp("train")
    started = time.perf_counter()
    proc = run(
        "src/train.py", *QUICK, "--epochs", "2", "--target-acc", "0.5", "--metrics-out", out / "m.json", timeout=300
    )
    wall_s = time.perf_counter() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads((out / "m.json").read_text()), proc.stdout, wall_s


def test_learns_on_a_subset(two_epochs):
    """Speed is the bench's job (a timed assertion fails on a busy machine); the subprocess timeout guards hangs."""
    metrics, stdout, _ = two_epochs
    first, second = metrics["epochs"]
    assert second["train_loss"] < first["train_loss"] < 2.3  # ln(10) = 2.30 is the loss of a uniform guess
    assert second["val_loss"] < 2.3
    assert metrics["test_acc"] == second["val_acc"] > 0.7  # chance is 0.1
    assert metrics["time_to_target_s"] is not None and metrics["time_to_target_s"] <= second["train_s"]
    assert "step 8/64 loss" in stdout  # the --log-every progress line, with the rate since the previous one
    assert re.search(r"step 16/64 loss \S+, \d+ images/s, [\d.]+ ms/step", stdout), stdout


def test_metrics_json_is_complete(two_epochs):
    metrics, _, _ = two_epochs
    for key in [
        "command",
        "script",
        "technique",
        "env",
        "world_size",
        "batch_size",
        "global_batch",
        "precision",
        "model",
        "dataset",
        "images_per_s",
        "step_ms_p50",
        "step_ms_p90",
        "data_wait_frac",
        "peak_mem_allocated_gib",
        "peak_mem_reserved_gib",
        "peak_mem_per_device",
        "peak_host_rss_gib",
        "epochs",
        "test_acc",
        "target_acc",
        "time_to_target_s",
        "train_s",
        "status",
        "args",
        "images_per_s_note",
        "first_step_s",
        "windows",
        "time_to_target_incl_compile_s",
    ]:
        assert key in metrics, key
    assert metrics["script"] == "train.py" and metrics["status"] == "ok" and metrics["world_size"] == 1
    assert metrics["global_batch"] == 128 and metrics["precision"] == "fp32" and metrics["device"] == "cpu"
    assert metrics["images_per_s"] > 0 and metrics["peak_host_rss_gib"] > 0
    assert 0 <= metrics["data_wait_frac"] < 1
    assert 0 < metrics["step_ms_p50"] <= metrics["step_ms_p90"]
    assert metrics["measured_steps"] == 2 * 32 - 5  # 4096 / 128 steps per epoch, warm-up left out
    assert metrics["env"]["torch"] == torch.__version__ and metrics["env"]["cpu_count"] > 0
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2]
    assert metrics["windows"] == 2  # one measured window per epoch: evaluation falls between them


def test_metrics_hold_their_provenance(two_epochs):
    """The commit, every flag with its value (defaults too), the CPU and its bf16 capability, the versions."""
    metrics, _, _ = two_epochs
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert metrics["env"]["git"]["commit"] == head and isinstance(metrics["env"]["git"]["dirty"], bool)
    args = metrics["args"]
    assert args["model"] == "cnn" and args["batch_size"] == 128 and args["subset"] == 4096  # given
    assert args["lr"] == 0.005 and args["seed"] == 0 and args["deterministic"] is False  # defaults, resolved
    env = metrics["env"]
    assert env["cpu_model"] and isinstance(env["bf16_instructions"], bool)
    flags = open("/proc/cpuinfo").read()
    assert env["bf16_instructions"] == ("avx512_bf16" in flags or "amx_bf16" in flags)
    assert set(env["cpu_flags"]) <= {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}


def test_a_run_shorter_than_its_warmup_says_not_measured(tmp_path):
    proc = run(
        "src/train.py", *QUICK[:4], "--subset", "256", "--batch-size", "128", "--epochs", "1", "--workers", "0",
        "--warmup-steps", "10", "--metrics-out", tmp_path / "m.json", timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "not measured: the run's 2 steps are all within --warmup-steps 10" in proc.stdout
    assert "0.0 images/s" not in proc.stdout
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["images_per_s"] is None and metrics["images_per_s_note"].startswith("not measured")


def test_resume_continues_from_the_saved_epoch(tmp_path):
    """A 2-epoch run killed right after its epoch-1 checkpoint, then the same line + --resume: only epoch 2 is
    trained, from the saved weights, and the metrics list both epochs, epoch 1's record the one last.pt holds (the
    killed run's results are not lost)."""
    ckpt = tmp_path / "ckpt"
    quick = [*QUICK, "--subset", "2048"]  # 16 steps an epoch (the mid-epoch resume: tests/test_preemption.py)
    stopped_after_first_checkpoint("src/train.py", *quick, "--epochs", "2", "--checkpoint-dir", ckpt)  # epoch 1 of 2
    saved = torch.load(ckpt / "last.pt", weights_only=False)
    assert saved["epoch"] == 1 and saved["step"] == 16
    assert [(e["epoch"], e["step"]) for e in saved["epochs"]] == [(1, 16)]  # the records of the epochs it finished

    second = run(
        "src/train.py",
        *quick,
        "--epochs",
        "2",
        "--checkpoint-dir",
        ckpt,
        "--resume",
        "--metrics-out",
        tmp_path / "m.json",
        timeout=300,
    )
    assert second.returncode == 0, second.stderr
    assert "resumed from" in second.stdout and "1 epochs and 16 steps done" in second.stdout
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2]  # the epoch before the stop is in the metrics too
    assert metrics["epochs"][0] == saved["epochs"][0] and "epoch 1 step" not in second.stdout  # not trained again
    assert metrics["steps"] == 32 and metrics["epochs"][1]["step"] == 32
    assert metrics["test_acc"] > 0.7  # it continued from trained weights, not from scratch
    assert torch.load(ckpt / "last.pt", weights_only=False)["epoch"] == 2


@pytest.mark.gpu
def test_trains_on_cuda_and_reports_device_memory(tmp_path):
    proc = run(
        "src/train.py",
        "--device",
        "cuda",
        "--subset",
        "4096",
        "--epochs",
        "1",
        "--batch-size",
        "128",
        "--workers",
        "2",
        "--metrics-out",
        tmp_path / "m.json",
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["device"] == "cuda" and metrics["peak_mem_allocated_gib"] > 0
    assert metrics["peak_mem_reserved_gib"] >= metrics["peak_mem_allocated_gib"]
    assert metrics["env"]["gpu_count"] >= 1 and metrics["images_per_s"] > 0 and metrics["test_acc"] > 0.6


def test_flops_per_image_are_the_hand_count_of_the_mlp(tmp_path):
    """The MLP (784 -> 256 -> 10) trained one step past the counted one: FlopCounterMode's training FLOPs per image
    equal the hand count, 2 per multiply-add: forward 2 x (784 x 256 + 256 x 10); backward the same for the weight
    gradients plus 2 x 256 x 10 for the input gradient of the second layer (the first layer's input, the images,
    needs none). achieved_tflops is flops_per_image x images/s / 1e12."""
    metrics = tmp_path / "m.json"
    proc = run("src/train.py", "--model", "mlp", "--device", "cpu", "--workers", "0", "--subset", "512", "--epochs",
               "1", "--warmup-steps", "1", "--metrics-out", metrics)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    m = json.loads(metrics.read_text())
    forward = 2 * (784 * 256 + 256 * 10)
    assert m["flops_per_image"] == 2 * forward + 2 * 256 * 10 == 818_176
    assert m["achieved_tflops"] == pytest.approx(m["flops_per_image"] * m["images_per_s"] / 1e12, rel=1e-12)
    assert "TFLOP/s (0.000818 GFLOPs per image)" in proc.stdout

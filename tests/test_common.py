"""common.py: Fashion-MNIST discovery and reading, the parser's refusals, the models, the meter."""

import argparse
import os
import shutil
import time

import pytest
import torch
from conftest import assert_one_line_error, run

import common


def test_reads_real_fashion_mnist(fmnist_dir):
    train, test = common.fashion_mnist(fmnist_dir)
    assert train.tensors[0].shape == (60_000, 1, 28, 28) and train.tensors[0].dtype == torch.float32
    assert test.tensors[0].shape == (10_000, 1, 28, 28)
    assert train.tensors[1].dtype == torch.int64
    # Fashion-MNIST is balanced: 6,000 training and 1,000 test images per class
    assert torch.bincount(train.tensors[1]).tolist() == [6000] * 10
    assert torch.bincount(test.tensors[1]).tolist() == [1000] * 10
    # normalised with the training set's own statistics
    assert abs(train.tensors[0].mean().item()) < 1e-3 and abs(train.tensors[0].std().item() - 1) < 1e-3
    subset, _ = common.fashion_mnist(fmnist_dir, subset=500)
    assert len(subset) == 500 and torch.equal(subset.tensors[0], train.tensors[0][:500])


def _copy_fmnist(src, dst):
    dst.mkdir(parents=True)
    for name in common.FASHION_MNIST_FILES.values():
        shutil.copy(src / name, dst / name)
    return dst


def test_discovery_order(fmnist_dir, tmp_path):
    first, second, empty = tmp_path / "first", tmp_path / "second", tmp_path / "empty"
    _copy_fmnist(fmnist_dir, first)
    _copy_fmnist(fmnist_dir, second)
    empty.mkdir()
    assert common.find_fashion_mnist(search=[first, second], download=False) == first
    assert common.find_fashion_mnist(search=[empty, second], download=False) == second
    # an explicit --data-dir wins over the search list, and its torchvision layout counts too
    nested = _copy_fmnist(fmnist_dir, tmp_path / "explicit" / "FashionMNIST" / "raw")
    assert common.find_fashion_mnist(tmp_path / "explicit", search=[first]) == nested


def test_nothing_found_names_the_three_ways(tmp_path):
    with pytest.raises(common.DataNotFound) as error:
        common.find_fashion_mnist(search=[tmp_path], download=False)
    message = str(error.value)
    assert "apt-get install dataset-fashion-mnist" in message and "data/" in message and "download" in message
    with pytest.raises(common.DataNotFound, match="does not exist"):
        common.find_fashion_mnist(tmp_path / "missing")
    with pytest.raises(common.DataNotFound, match="lacks the Fashion-MNIST files"):
        common.find_fashion_mnist(tmp_path)


def test_train_with_missing_data_dir_is_one_line(tmp_path):
    proc = run("src/train.py", "--device", "cpu", "--data-dir", tmp_path / "nope", timeout=120)
    assert_one_line_error(proc, "does not exist", "apt-get install dataset-fashion-mnist")


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--batch-size", "0"], "--batch-size"),
        (["--lr", "-0.1"], "--lr"),
        (["--epochs", "0"], "--epochs"),
        (["--model", "vgg"], "--model"),
        (["--target-acc", "91"], "--target-acc"),
        (["--resume"], "--checkpoint-dir"),
    ],
)
def test_parser_rejects_bad_values(flags, fragment):
    proc = run("src/train.py", "--device", "cpu", *flags, timeout=120)
    assert proc.returncode == 2
    assert_one_line_error(proc, fragment)


def test_batch_larger_than_subset_is_refused():
    proc = run("src/train.py", "--device", "cpu", "--subset", "100", "--batch-size", "128", timeout=120)
    assert_one_line_error(proc, "--batch-size 128 is larger than the 100 training images")


@pytest.mark.parametrize("name, channels, size", [("cnn", 1, 28), ("resnet18", 1, 28), ("resnet50", 3, 64)])
def test_models_map_images_to_ten_logits(name, channels, size):
    model = common.build_model(name, channels, size).eval()
    with torch.no_grad():
        logits = model(torch.randn(2, channels, size, size))
    assert logits.shape == (2, 10) and logits.dtype == torch.float32


@pytest.mark.parametrize("flags", [[], ["--dataset", "synthetic", "--image-size", "32"]])
def test_scripts_model_fits_the_data(flags, monkeypatch):
    monkeypatch.setattr("sys.argv", ["train.py", *flags])
    args = common.parse_args(common.get_parser())
    channels, size = common.input_shape(args)
    model = common.build_model("resnet18", *common.input_shape(args))
    assert model.fc.out_features == 10 and model.conv1.in_channels == channels
    assert model(torch.randn(2, channels, size, size)).shape == (2, 10)


def test_meter_leaves_warmup_and_evaluation_out():
    meter = common.Meter(torch.device("cpu"), warmup_steps=2)
    meter.resume()
    for delay in [0.3, 0.3, 0.02, 0.02, 0.02, 0.02]:  # two slow warm-up steps, then four fast ones
        for _ in meter.loader([None]):
            time.sleep(delay)
            meter.step(10)
    meter.pause()
    time.sleep(0.3)  # evaluation: outside every window
    meter.resume()
    for _ in meter.loader(range(2)):
        time.sleep(0.02)
        meter.step(10)
    stats = meter.summary()
    assert stats["measured_steps"] == 6
    # 60 images over ~6 x 20 ms: far above what the warm-up or the pause would allow (60 / 0.72 s = 83)
    assert 150 < stats["images_per_s"] <= 60 / 0.12
    assert stats["data_wait_frac"] < 0.2 and stats["step_ms_p50"] >= 20
    assert stats["train_s"] >= 0.7 and stats["peak_host_rss_gib"] > 0


def test_meter_keeps_a_step_marked_unmeasured_out_of_the_window(monkeypatch):
    """train_compile.py marks a step that recompiled `measured=False`: its seconds, images and step time are left
    out, and the window goes on after it. A fake clock makes the arithmetic exact: 10 ms per step, 5 s for the
    recompiling step."""
    clock = [0.0]
    monkeypatch.setattr(common.time, "perf_counter", lambda: clock[0])
    meter = common.Meter(torch.device("cpu"), warmup_steps=1)
    meter.resume()
    for seconds, measured in [(2.0, True), (0.01, True), (0.01, True), (5.0, False), (0.01, True), (0.01, True)]:
        for _ in meter.loader([None]):
            clock[0] += seconds  # the step's work
            meter.step(8, measured=measured)
    stats = meter.summary()
    assert stats["excluded_steps"] == 1 and stats["measured_steps"] == 4  # the warm-up and the recompile left out
    assert stats["images_per_s"] == pytest.approx(4 * 8 / 0.04)  # 32 images in 40 ms, not in 5.04 s
    assert stats["step_ms_p50"] == pytest.approx(10) and stats["windows"] == 2


# -- checkpoints: what --resume refuses that the scripts cannot produce on a CPU -----------------------------------


def _args(**flags):
    return argparse.Namespace(
        **{"model": "mlp", "dataset": "fashion-mnist", "image_size": None, "seed": 0, "batch_size": 64, **flags}
    )


@pytest.mark.parametrize(
    "saved_with, resumed_with, fragment",
    [
        ({"optimizer": torch.optim.SGD}, {}, "optimizer SGD there, AdamW here"),
        # an enabled GradScaler (float16) has a loss scale to restore; a disabled one (bfloat16, float32) has none
        ({"scaler": True}, {}, "extra state scaler there, none here"),
        ({}, {"scaler": True}, "extra state none there, scaler here"),
    ],
)
def test_resume_refuses_another_optimizer_or_extra_state_before_loading_anything(
    saved_with, resumed_with, fragment, tmp_path, capsys
):
    def parts(optimizer=torch.optim.AdamW, scaler=False):
        model = common.build_model("mlp")
        return model, optimizer(model.parameters(), lr=0.1), torch.amp.GradScaler("cpu", enabled=scaler)

    model, optimizer, scaler = parts(**saved_with)
    common.save_checkpoint(tmp_path / "last.pt", _args(), model, optimizer, 1, 10, scaler=scaler)
    model, optimizer, scaler = parts(**resumed_with)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    with pytest.raises(SystemExit) as exit:
        common.load_checkpoint(tmp_path / "last.pt", _args(), model, optimizer, scaler=scaler)
    assert exit.value.code == 2
    assert fragment in capsys.readouterr().err
    assert all(torch.equal(before[key], value) for key, value in model.state_dict().items())  # nothing half-loaded


def test_a_checkpoint_round_trip_restores_model_optimizer_and_loss_scale(tmp_path):
    model = common.build_model("mlp")
    optimizer = torch.optim.AdamW(model.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    model(torch.randn(8, 1, 28, 28)).sum().backward()
    optimizer.step()
    common.save_checkpoint(tmp_path / "last.pt", _args(), model, optimizer, 1, 10, scaler=scaler, sampler_epoch=1)
    twin = common.build_model("mlp")
    twin_optimizer = torch.optim.AdamW(twin.parameters())
    twin_scaler = torch.amp.GradScaler("cpu", init_scale=2.0)
    (tmp_path / f".last.pt.{2**30}.tmp").write_bytes(b"half a checkpoint")  # left by a killed writer (no such pid)
    (tmp_path / f".last.pt.{os.getppid()}.tmp").write_bytes(b"")  # a live writer's: kept
    common.save_checkpoint(tmp_path / "last.pt", _args(), model, optimizer, 1, 10, scaler=scaler, sampler_epoch=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".last.pt.{os.getppid()}.tmp", "last.pt"]
    state = common.load_checkpoint(tmp_path / "last.pt", _args(), twin, twin_optimizer, scaler=twin_scaler)
    assert state["epoch"] == 1 and state["step"] == 10 and state["sampler_epoch"] == 1
    assert state["format"] == common.CHECKPOINT_FORMAT and state["made_by"]["state"] == ["scaler"]
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin.state_dict().values()))
    assert twin_optimizer.state_dict()["state"][0]["step"] == 1 and twin_scaler.get_scale() == 1024.0

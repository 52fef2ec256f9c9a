"""common.cli: the shared flags' refusals, and the input shape the parsed flags give the model factory."""

import pytest
import torch
from conftest import assert_one_line_error, run

import common


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


@pytest.mark.parametrize("flags", [[], ["--dataset", "synthetic", "--image-size", "32"]])
def test_scripts_model_fits_the_data(flags, monkeypatch):
    monkeypatch.setattr("sys.argv", ["train.py", *flags])
    args = common.parse_args(common.get_parser())
    channels, size = common.input_shape(args)
    model = common.build_model("resnet18", *common.input_shape(args))
    assert model.fc.out_features == 10 and model.conv1.in_channels == channels
    assert model(torch.randn(2, channels, size, size)).shape == (2, 10)

"""common.data: Fashion-MNIST discovery and reading, and the one-line refusals of data a script cannot train on."""

import shutil

import pytest
import torch
from conftest import assert_one_line_error, run

import common


def test_reads_real_fashion_mnist(fmnist_dir):
    train, test = common.data.fashion_mnist(fmnist_dir)
    assert train.tensors[0].shape == (60_000, 1, 28, 28) and train.tensors[0].dtype == torch.float32
    assert test.tensors[0].shape == (10_000, 1, 28, 28)
    assert train.tensors[1].dtype == torch.int64
    # Fashion-MNIST is balanced: 6,000 training and 1,000 test images per class
    assert torch.bincount(train.tensors[1]).tolist() == [6000] * 10
    assert torch.bincount(test.tensors[1]).tolist() == [1000] * 10
    # normalised with the training set's own statistics
    assert abs(train.tensors[0].mean().item()) < 1e-3 and abs(train.tensors[0].std().item() - 1) < 1e-3
    subset, _ = common.data.fashion_mnist(fmnist_dir, subset=500)
    assert len(subset) == 500 and torch.equal(subset.tensors[0], train.tensors[0][:500])


def _copy_fmnist(src, dst):
    dst.mkdir(parents=True)
    for name in common.data.FASHION_MNIST_FILES.values():
        shutil.copy(src / name, dst / name)
    return dst


def test_discovery_order(fmnist_dir, tmp_path):
    first, second, empty = tmp_path / "first", tmp_path / "second", tmp_path / "empty"
    _copy_fmnist(fmnist_dir, first)
    _copy_fmnist(fmnist_dir, second)
    empty.mkdir()
    assert common.data.find_fashion_mnist(search=[first, second], download=False) == first
    assert common.data.find_fashion_mnist(search=[empty, second], download=False) == second
    # an explicit --data-dir wins over the search list, and its torchvision layout counts too
    nested = _copy_fmnist(fmnist_dir, tmp_path / "explicit" / "FashionMNIST" / "raw")
    assert common.data.find_fashion_mnist(tmp_path / "explicit", search=[first]) == nested


def test_nothing_found_names_the_three_ways(tmp_path):
    with pytest.raises(common.data.DataNotFound) as error:
        common.data.find_fashion_mnist(search=[tmp_path], download=False)
    message = str(error.value)
    assert "apt-get install dataset-fashion-mnist" in message and "data/" in message and "download" in message
    with pytest.raises(common.data.DataNotFound, match="does not exist"):
        common.data.find_fashion_mnist(tmp_path / "missing")
    with pytest.raises(common.data.DataNotFound, match="lacks the Fashion-MNIST files"):
        common.data.find_fashion_mnist(tmp_path)


def test_train_with_missing_data_dir_is_one_line(tmp_path):
    proc = run("src/train.py", "--device", "cpu", "--data-dir", tmp_path / "nope", timeout=120)
    assert_one_line_error(proc, "does not exist", "apt-get install dataset-fashion-mnist")


def test_batch_larger_than_subset_is_refused():
    proc = run("src/train.py", "--device", "cpu", "--subset", "100", "--batch-size", "128", timeout=120)
    assert_one_line_error(proc, "--batch-size 128 is larger than the 100 training images")

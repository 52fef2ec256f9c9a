"""common.checkpoint: what --resume refuses that the scripts cannot produce on a CPU, and a round trip."""

import argparse
import os

import pytest
import torch

import common


def _args(**flags):
    return argparse.Namespace(
        **{
            "model": "mlp",
            "dataset": "fashion-mnist",
            "image_size": None,
            "seed": 0,
            "batch_size": 64,
            "epochs": 1,
            "max_steps": None,
            "lr": 0.1,
            **flags,
        }
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
    assert state["format"] == common.checkpoint.CHECKPOINT_FORMAT and state["made_by"]["state"] == ["scaler"]
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin.state_dict().values()))
    assert twin_optimizer.state_dict()["state"][0]["step"] == 1 and twin_scaler.get_scale() == 1024.0

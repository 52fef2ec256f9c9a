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
            "run": common.runstate.RunState(),  # what parse_args adds: where the saves are recorded
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


def test_a_checkpoint_round_trip_restores_model_optimizer_loss_scale_and_epoch_records(tmp_path):
    """save_checkpoint then load_checkpoint: the weights, AdamW's state, the loss scale, plain extras and the epoch
    records come back. A file without records (an older one, or a write_full_state call given none) loads with
    "epochs" [], so that every script can read state["epochs"]."""
    records = [{"epoch": 1, "step": 10, "train_loss": 0.5, "val_loss": 0.25, "val_acc": 0.75, "logits_dtype": None}]
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
    common.save_checkpoint(
        tmp_path / "last.pt", _args(), model, optimizer, 1, 10, records, scaler=scaler, sampler_epoch=1
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".last.pt.{os.getppid()}.tmp", "last.pt", "last.pt.sha256"]
    state = common.load_checkpoint(tmp_path / "last.pt", _args(), twin, twin_optimizer, scaler=twin_scaler)
    assert state["epoch"] == 1 and state["step"] == 10 and state["sampler_epoch"] == 1 and state["epochs"] == records
    assert state["format"] == common.checkpoint.CHECKPOINT_FORMAT and state["made_by"]["state"] == ["scaler"]
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin.state_dict().values()))
    assert twin_optimizer.state_dict()["state"][0]["step"] == 1 and twin_scaler.get_scale() == 1024.0

    del state["epochs"]  # a file saved before the records were (and before the digest beside it: format 4)
    torch.save({**state, "format": 4}, tmp_path / "last.pt")
    (tmp_path / "last.pt.sha256").unlink()
    older = common.load_checkpoint(tmp_path / "last.pt", _args(), twin, twin_optimizer, scaler=twin_scaler)
    assert older["epochs"] == [] and older["step"] == 10
    gathered = {"model": model.state_dict()}  # what gather_full_state gives rank 0 (no process group needed here)
    (tmp_path / "step10").mkdir()  # the DCP folder the save completes (its files listed in step10/digests.sha256)
    (tmp_path / "step10" / ".metadata").write_bytes(b"what dcp.save wrote")
    assert common.distributed.write_full_state(tmp_path / "full.pt", _args(), gathered, 1, 10, sharded="step10")
    state = common.load_checkpoint(tmp_path / "full.pt", _args(), None)
    assert state["epochs"] == [] and state["sharded"] == "step10"


def test_resume_refuses_another_stage_cut_and_an_optimizer_state_of_other_shapes(tmp_path, capsys):
    """--balance is part of what a checkpoint must share (train_pipeline.py keeps one optimizer state per stage, which
    fits only the cut that saved it; train_model_parallel.py's file names its cut too): another cut is refused
    before anything is loaded. An optimizer state with as many parameters as the optimizer it is loaded into but
    other shapes (a stage's state given to the other stage: load_state_dict counts the parameters, it does not
    measure them) is refused by load_part in load_checkpoint's one line, not left to fail at the first step."""
    model = common.build_model("mlp")
    common.save_checkpoint(tmp_path / "last.pt", _args(balance="params"), model, None, 1, 10)
    with pytest.raises(SystemExit) as exit:
        common.load_checkpoint(tmp_path / "last.pt", _args(balance="flops"), model)
    assert exit.value.code == 2
    assert "stage cut (--balance) params there, flops here" in capsys.readouterr().err

    stages = [torch.nn.Linear(4, 3), torch.nn.Linear(3, 4)]  # two parameters each, of other shapes
    optimizers = [torch.optim.AdamW(stage.parameters()) for stage in stages]
    for stage, optimizer in zip(stages, optimizers):
        stage(torch.randn(2, stage.in_features)).sum().backward()
        optimizer.step()
    state = {"stage_optimizers": [optimizers[1].state_dict(), optimizers[0].state_dict()]}  # swapped
    before = optimizers[0].state_dict()["state"][0]["exp_avg"].clone()
    with pytest.raises(SystemExit) as exit:
        common.checkpoint.load_part(tmp_path / "last.pt", optimizers[0], state, "stage_optimizers", 0)
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "does not fit this model and optimizer (exp_avg of shape (4, 3) for a parameter of shape (3, 4))" in err
    assert len(err.strip().splitlines()) == 1
    assert torch.equal(optimizers[0].state_dict()["state"][0]["exp_avg"], before)  # nothing loaded
    common.checkpoint.load_part(tmp_path / "last.pt", optimizers[0], state, "stage_optimizers", 1)  # its own: loads

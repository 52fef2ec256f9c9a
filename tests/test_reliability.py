"""Runs that survive: train_DDP_elastic.py under `torchrun --max-restarts` after a worker is SIGKILLed, and
--deterministic runs."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from conftest import REPO, run

# torchrun's agent shares its TCPStore with the workers and keeps it across restarts, so a restarted gloo/NCCL group
# can read the dead group's addresses (connectFullMesh: connection refused). With this variable set, each attempt's
# rank 0 hosts a fresh store: the launch line the README gives for --max-restarts.
RESTARTABLE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
# 12,800 images x 2 epochs, global batch 128: 100 steps an epoch, so a checkpoint every 40 steps lands mid-epoch.
DDP = [
    "src/train_DDP_elastic.py", "--device", "cpu", "--workers", "0", "--subset", "12800", "--batch-size", "64",
    "--epochs", "2", "--seed", "0", "--warmup-steps", "3", "--log-every", "1000",
]  # fmt: skip


def _worker_pid(agent: int, rank: int) -> int | None:
    """The pid of the worker with RANK=`rank` among the children of the torchrun agent `agent`."""
    children = Path(f"/proc/{agent}/task/{agent}/children").read_text().split()
    for pid in children:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ:
            return int(pid)
    return None


def test_elastic_ddp_survives_a_killed_worker_and_finishes_like_an_uninterrupted_run(tmp_path):
    reference = subprocess.run(
        [*TORCHRUN, *DDP, "--metrics-out", tmp_path / "reference.json"], cwd=REPO, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert reference.returncode == 0, reference.stdout + reference.stderr

    metrics = tmp_path / "restarted.json"
    argv = [
        *TORCHRUN[:3], "--max-restarts", "1", *TORCHRUN[3:], *DDP,
        "--checkpoint-dir", tmp_path / "ckpt", "--checkpoint-every", "40", "--resume", "--metrics-out", metrics,
    ]  # fmt: skip
    job = subprocess.Popen(
        list(map(str, argv)), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **RESTARTABLE},
    )  # fmt: skip
    output, killed = [], None
    deadline = time.monotonic() + 600
    for line in job.stdout:  # rank 0 prints to torchrun's stdout
        output.append(line)
        if killed is None and line.startswith("checkpoint: epoch 1 step 40 "):
            killed = _worker_pid(job.pid, rank=1)
            assert killed, "no worker with RANK=1 under the torchrun agent"
            os.kill(killed, signal.SIGKILL)  # mid-epoch 1: the checkpoint holds 40 of its 100 steps
        assert time.monotonic() < deadline, "".join(output)
    rc = job.wait(timeout=60)
    text = "".join(output)
    assert killed, text
    assert rc == 0, text
    assert re.search(r"resumed from .*last\.pt: 0 epochs and (40|80) steps done", text), text  # a restart, mid-epoch
    restarted = json.loads(metrics.read_text())
    assert [e["epoch"] for e in restarted["epochs"]] == [1, 2] and restarted["steps"] == 200
    baseline = json.loads((tmp_path / "reference.json").read_text())
    print(f"test acc: uninterrupted {baseline['test_acc']:.4f}, killed and restarted {restarted['test_acc']:.4f}")
    assert abs(restarted["test_acc"] - baseline["test_acc"]) <= 0.01, (restarted["test_acc"], baseline["test_acc"])
    state = torch.load(tmp_path / "ckpt" / "last.pt", weights_only=False)
    assert state["epoch"] == state["sampler_epoch"] == 2 and state["step"] == 200
    assert not any(key.startswith("module.") for key in state["model"])  # the bare model: loads into train.py


def _losses(stdout: str) -> list[str]:
    return re.findall(r"step \d+/\d+ loss (\S+)", stdout)


def test_deterministic_runs_repeat_every_loss_and_weight(tmp_path):
    """Two runs with --deterministic and the same seed: the same loss at every step and bit-identical weights."""
    flags = [
        "--device", "cpu", "--subset", "2048", "--batch-size", "64", "--epochs", "1", "--workers", "2",
        "--log-every", "1", "--seed", "7", "--deterministic",
    ]  # fmt: skip
    procs = []
    for name in ("a", "b"):
        proc = run(
            "src/train.py", *flags, "--checkpoint-dir", tmp_path / name, "--metrics-out", tmp_path / f"{name}.json"
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        procs.append(proc)
    first, second = (_losses(p.stdout) for p in procs)
    assert len(first) == 32 and first == second
    a, b = (torch.load(tmp_path / name / "last.pt", weights_only=False)["model"] for name in ("a", "b"))
    assert all(torch.equal(a[key], b[key]) for key in a)
    env = json.loads((tmp_path / "a.json").read_text())["env"]
    assert env["deterministic_algorithms"] is True


def test_without_the_flag_deterministic_algorithms_stay_off(tmp_path):
    proc = run(
        "src/train.py", "--device", "cpu", "--dataset", "synthetic", "--image-size", "28", "--subset", "256",
        "--batch-size", "64", "--epochs", "1", "--metrics-out", tmp_path / "m.json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "m.json").read_text())["env"]["deterministic_algorithms"] is False


def test_elastic_ddp_resumes_a_run_that_max_steps_cut_mid_epoch(tmp_path):
    """--max-steps 10 ends epoch 1 after 10 of its 16 steps; --resume then runs epoch 2 whole (nothing to skip)."""
    flags = [*TORCHRUN[:5], "1", "src/train_DDP_elastic.py", *DDP[1:6], "2048", "--batch-size", "128", "--epochs", "2",
             "--log-every", "1000", "--checkpoint-dir", tmp_path]  # fmt: skip
    first = subprocess.run([*flags, "--max-steps", "10"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    second = subprocess.run(
        [*flags, "--resume", "--metrics-out", tmp_path / "m.json"], cwd=REPO, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr
    assert "resumed from" in second.stdout and "1 epochs and 10 steps done" in second.stdout
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["steps"] == 10 + 16 and [e["epoch"] for e in metrics["epochs"]] == [1, 2]

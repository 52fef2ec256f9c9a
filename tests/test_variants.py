"""train_DP.py, train_DDP.py and train_amp.py on real Fashion-MNIST, as real subprocesses (torchrun for DDP)."""

import json
import shutil
import socket
import subprocess

import pytest
import torch
import conftest
from conftest import REPO, assert_loads_into_train_py, assert_one_line_error, run

import common

QUICK = ["--device", "cpu", "--model", "cnn", "--workers", "0", "--warmup-steps", "3", "--log-every", "4"]


def torchrun(*argv, timeout=600):
    return conftest.torchrun(*argv, timeout=timeout)


# -- DistributedDataParallel ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    """Two gloo processes, 2 epochs on 2,048 images; each rank leaves its sampler's shards and its model behind."""
    out = tmp_path_factory.mktemp("ddp")
    proc = torchrun(
        "--nproc-per-node", "2", "--log-dir", out / "logs", "--redirects", "3",
        "tests/ddp_probe.py", out, "--",
        *QUICK, "--subset", "2048", "--epochs", "2", "--batch-size", "128",
        "--checkpoint-dir", out / "ckpt", "--metrics-out", out / "m.json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    return out, json.loads((out / "m.json").read_text()), ranks


def test_ddp_shards_are_disjoint_cover_the_data_and_reshuffle_each_epoch(ddp):
    _, _, ranks = ddp
    for epoch in (0, 1):
        a, b = ranks[0]["shards"][epoch], ranks[1]["shards"][epoch]
        assert len(a) == len(b) == 1024
        assert not set(a) & set(b)
        assert set(a) | set(b) == set(range(2048))
    assert ranks[0]["shards"][0] != ranks[0]["shards"][1]  # sampler.set_epoch(epoch) changed the permutation
    assert ranks[0]["sampler_epoch"] == ranks[1]["sampler_epoch"] == 1  # the script called it for the last epoch


def test_ddp_parameters_are_identical_on_both_ranks(ddp):
    _, _, ranks = ddp
    names = ranks[0]["parameters"]
    assert names
    for name in names:
        assert torch.equal(ranks[0]["state"][name], ranks[1]["state"][name]), name
    initial = common.build_model("cnn", 1, 28)
    trained = ranks[0]["state"]["0.weight"]
    assert not torch.equal(initial.state_dict()["0.weight"], trained)  # it did train


def test_ddp_test_accuracy_counts_each_of_the_10000_images_once(ddp, fmnist_dir):
    _, metrics, ranks = ddp
    assert metrics["test_images"] == 10_000
    shards = [set(r["test_indices"]) for r in ranks]
    assert not shards[0] & shards[1] and len(shards[0] | shards[1]) == 10_000
    # Recompute the accuracy from outside: each rank's model on its own shard, summed.
    _, test_set = common.data.fashion_mnist(fmnist_dir)
    correct = 0.0
    for r in ranks:
        model = common.build_model("cnn", 1, 28)
        model.load_state_dict(r["state"])
        loader = torch.utils.data.DataLoader(torch.utils.data.Subset(test_set, r["test_indices"]), batch_size=1000)
        _, acc = common.evaluate(model, loader, torch.device("cpu"))
        correct += acc * len(r["test_indices"])
    assert metrics["test_acc"] == pytest.approx(correct / 10_000, abs=2e-4)  # 2 images of slack for CPU kernels


def test_ddp_only_rank_0_prints_and_writes(ddp):
    out, _, ranks = ddp
    assert ranks[0]["writes"].count("save_checkpoint") == 2 and "write_metrics" in ranks[0]["writes"]
    assert ranks[1]["writes"] == []
    stdout = {r: "".join(p.read_text() for p in out.glob(f"logs/**/{r}/stdout.log")) for r in (0, 1)}
    assert "epoch 2: train loss" in stdout[0]
    assert stdout[1].strip() == ""
    assert (out / "ckpt" / "last.pt").exists()


def test_ddp_metrics_are_global(ddp):
    _, metrics, _ = ddp
    assert metrics["script"] == "train_DDP.py" and metrics["technique"] == "DistributedDataParallel"
    assert metrics["world_size"] == 2 and metrics["gpus"] == 0
    assert metrics["batch_size"] == 128 and metrics["global_batch"] == 256
    assert metrics["steps"] == 2 * 2048 // 256  # each rank ran its half of the data
    assert metrics["images_per_s"] > 0


def test_ddp_checkpoint_loads_into_train_py_and_resume_refuses_another_world_size(ddp, tmp_path):
    out, _, _ = ddp
    state = assert_loads_into_train_py(out / "ckpt" / "last.pt")
    assert state["made_by"]["world_size"] == 2 and state["made_by"]["script"] == "train_DDP.py"
    for name in ("last.pt", "last.pt.sha256"):  # the checkpoint and its digest, as a copy of the folder has them
        shutil.copy(out / "ckpt" / name, tmp_path / name)
    proc = torchrun(
        "--standalone", "--nproc-per-node", "1", "src/train_DDP.py", *QUICK, "--subset", "2048", "--epochs", "2",
        "--batch-size", "128", "--checkpoint-dir", tmp_path, "--resume",
    )  # fmt: skip
    assert proc.returncode != 0 and "resumed from" not in proc.stdout
    errors = [line for line in proc.stderr.splitlines() if "train_DDP.py: error: " in line]
    assert errors and "world size 2 there, 1 here" in errors[0], proc.stderr
    assert "src/common/" not in proc.stderr  # one line from the worker; torchrun's own report follows it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_node_rendezvous_on_localhost(tmp_path):
    """Two torchrun agents, one process each, meet through a c10d rendezvous, as two nodes would."""
    port = _free_port()

    def agent_command(node):
        return conftest.torchrun_command(
            "--nnodes", "2", "--node-rank", node, "--nproc-per-node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-nodes",
            "src/train_DDP.py", *QUICK, "--subset", "1024", "--epochs", "1",
            "--metrics-out", tmp_path / f"node{node}.json",
        )  # fmt: skip

    commands = [agent_command(node) for node in (0, 1)]
    agents = [
        subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for argv, env in commands
    ]
    try:
        logs = [agent.communicate(timeout=300)[0] for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
    assert [agent.returncode for agent in agents] == [0, 0], "\n".join(logs)
    written = [p for p in (tmp_path / "node0.json", tmp_path / "node1.json") if p.exists()]
    assert len(written) == 1  # rank 0 lives on one node only
    metrics = json.loads(written[0].read_text())
    assert metrics["world_size"] == 2 and metrics["test_images"] == 10_000


def test_ddp_without_torchrun_says_how_to_launch():
    proc = run("src/train_DDP.py", *QUICK, "--subset", "1024")
    assert_one_line_error(proc, "launch with torchrun", "--nproc-per-node")


# -- Mixed precision --------------------------------------------------------------------------------------------


def test_amp_float16_on_cpu_runs_float16_with_a_gradscaler_and_checkpoints_its_scale(tmp_path):
    """--amp-dtype float16 on a CPU runs what it asks for (emulated without AVX512-FP16 / AMX-FP16, and says so):
    float16 logits, an enabled GradScaler, whose state (the loss scale) travels with the checkpoint. What it computes
    against train.py, clipping included: tests/test_equivalence.py."""
    flags = [*QUICK, "--subset", "512", "--epochs", "1", "--checkpoint-dir", tmp_path, "--clip-grad-norm", "1.0"]
    proc = run("src/train_amp.py", *flags, "--amp-dtype", "float16", "--metrics-out", tmp_path / "m.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "AMP: float16 on a CPU is emulated unless it has AVX512-FP16 / AMX-FP16" in proc.stdout
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["precision"] == "amp float16" and metrics["epochs"][-1]["logits_dtype"] == "torch.float16"
    state = torch.load(tmp_path / "last.pt", weights_only=False)
    assert state["made_by"]["state"] == ["scaler"] and state["scaler"]["scale"] > 0  # enabled: it has a loss scale


def test_amp_float16_gradscaler_scales_the_loss():
    """The GradScaler line in train_amp.py: fp16 grads of a scaled loss unscale to the fp32 gradient."""
    if not torch.amp.GradScaler("cpu").is_enabled():
        pytest.skip("this torch has no CPU GradScaler")
    model = torch.nn.Linear(4, 2)
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    reference = model.weight.grad.clone()
    model.weight.grad = None
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    scaler.scale(torch.nn.functional.cross_entropy(model(x), y)).backward()
    assert torch.allclose(model.weight.grad, reference * 2.0**10, rtol=1e-4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler.unscale_(optimizer)
    assert torch.allclose(model.weight.grad, reference, rtol=1e-4)


# -- DataParallel -----------------------------------------------------------------------------------------------


# -- On a GPU ---------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_amp_float16_on_cuda(tmp_path):
    proc = run(
        "src/train_amp.py", "--device", "cuda", "--dataset", "synthetic", "--model", "resnet18", "--image-size", "64",
        "--subset", "2048", "--batch-size", "128", "--metrics-out", tmp_path / "m.json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["precision"] == "amp float16" and metrics["epochs"][-1]["logits_dtype"] == "torch.float16"
    assert metrics["gpus"] == 1 and metrics["peak_mem_allocated_gib"] > 0


@pytest.mark.gpu
def test_ddp_nccl_on_all_gpus(tmp_path):
    gpus = torch.cuda.device_count()
    proc = torchrun(
        "--nproc-per-node", gpus, "src/train_DDP.py", "--device", "cuda", "--subset", "4096", "--epochs", "1",
        "--metrics-out", tmp_path / "m.json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["world_size"] == metrics["gpus"] == gpus and metrics["test_images"] == 10_000


@pytest.mark.gpu
def test_ddp_more_processes_than_gpus_is_refused():
    proc = torchrun(
        "--nproc-per-node", torch.cuda.device_count() + 1, "src/train_DDP.py", "--device", "cuda", "--subset", "1024"
    )
    assert proc.returncode != 0
    assert "has no GPU" in proc.stderr and "lower --nproc-per-node" in proc.stderr
    assert 'train_DDP.py", line' not in proc.stderr

"""--deterministic runs, and a run that --max-steps cut mid-epoch: finished, and not resumed into another schedule
(restarts at every step boundary under `torchrun --max-restarts`: tests/test_equivalence.py)."""

import json
import re

import torch
from conftest import run, torchrun

ELASTIC = ["src/train_DDP_elastic.py", "--device", "cpu", "--workers", "0", "--subset", "2048", "--batch-size", "128",
           "--epochs", "2", "--seed", "0", "--warmup-steps", "3", "--log-every", "1000"]  # fmt: skip


def _losses(stdout: str) -> list[str]:
    return re.findall(r"step \d+/\d+ loss (\S+)", stdout)


def test_deterministic_runs_repeat_every_loss_and_weight(tmp_path):
    """Two runs with --deterministic and the same seed: the same loss at every step and bit-identical weights."""
    flags = [
        "--device", "cpu", "--subset", "512", "--batch-size", "64", "--epochs", "1", "--workers", "2",
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
    assert len(first) == 8 and first == second
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


def test_a_run_that_max_steps_cut_mid_epoch_is_finished_and_another_length_is_refused(tmp_path):
    """--max-steps 10 ends epoch 1 after 10 of its 16 steps, a finished run: --resume with the same flags says so and
    exits 0; --resume without --max-steps (or with another) would reshape the one-cycle schedule, which ended at step
    10, into one of 32 steps resumed at step 10: refused in one line, the checkpoint left as it was."""
    flags = ["--standalone", "--nproc-per-node", "1", *ELASTIC, "--checkpoint-dir", tmp_path]
    first = torchrun(*flags, "--max-steps", "10", timeout=300)
    assert first.returncode == 0, first.stderr
    saved = (tmp_path / "last.pt").read_bytes()
    again = torchrun(*flags, "--max-steps", "10", "--resume", timeout=300)
    assert again.returncode == 0 and "holds a finished run (10 of 10 steps)" in again.stdout, again.stderr
    longer = torchrun(*flags, "--resume", timeout=300)
    errors = [line for line in longer.stderr.splitlines() if "train_DDP_elastic.py: error: " in line]
    assert longer.returncode != 0 and "resumed from" not in longer.stdout
    assert errors and "max steps 10 there, none here" in errors[0], longer.stderr
    assert (tmp_path / "last.pt").read_bytes() == saved

"""--target-loss (common/target.py): the probe's loss is the held-out loss evaluate() computes, it is taken every K
steps and not after the target, its time is a probe's training seconds, and the runs it cannot time are refused."""

import json

import pytest
from conftest import run
from test_equivalence import SAME

# 16 steps of 16 blocks of 32 characters; the held-out set cut to 64 blocks and the probe's sample to all of them, so
# that the probe and the epoch's evaluation see the same characters
GPT = ["--model", "gpt", "--subset", "256", "--test-subset", "64", "--seq-len", "32", "--batch-size", "16",
       "--epochs", "1", "--sample-chars", "0", "--eval-every", "4", "--target-sample", "64"]  # fmt: skip


def test_the_probe_takes_the_held_out_loss_every_k_steps_until_the_target(tmp_path):
    """A target just under the loss at step 8: probes at steps 4 and 8 only (none after the target), the time to it
    the training seconds at step 8's probe, within the run's; at the end the probe's loss over all 64 held-out blocks
    equals the epoch's evaluation of them (gap under 1e-5: only the order of a float sum differs)."""
    first = run("src/train.py", *SAME, *GPT, "--target-loss", "0.5", "--metrics-out", tmp_path / "a.json")
    assert first.returncode == 0, first.stderr
    probes = json.loads((tmp_path / "a.json").read_text())["target_probes"]
    assert [p["step"] for p in probes] == [4, 8, 12, 16]  # 0.5 is never reached: every 4th step, to the end
    assert all(b["loss"] < a["loss"] for a, b in zip(probes, probes[1:]))
    target = probes[1]["loss"] + 1e-4  # reached at the second probe, a hair above its loss
    second = run("src/train.py", *SAME, *GPT, "--target-loss", str(target), "--metrics-out", tmp_path / "b.json")
    assert second.returncode == 0, second.stderr
    m = json.loads((tmp_path / "b.json").read_text())
    assert [p["step"] for p in m["target_probes"]] == [4, 8] and m["steps_to_target"] == 8
    assert m["time_to_target_s"] == m["target_probes"][1]["train_s"] <= m["train_s"]
    assert abs(m["target_probes"][1]["loss"] - probes[1]["loss"]) < 1e-6  # the same run up to there
    assert abs(m["target_sample_gap"]) < 1e-5 and m["target_sample_blocks"] == 64
    assert "time to held-out sample loss" in second.stdout and "8 steps" in second.stdout


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--model", "cnn", "--target-loss", "1.0"], "--target-loss is a language model's"),
        (["--model", "gpt", "--dataset", "synthetic", "--target-loss", "1.0"], "needs held-out text"),
        (["--model", "gpt", "--target-loss", "1.0", "--resume", "--checkpoint-dir", "{tmp}"], "without --resume"),
    ],
)
def test_a_run_the_probe_cannot_time_is_refused_in_one_line(flags, says, tmp_path):
    proc = run("src/train.py", *SAME, *[f.replace("{tmp}", str(tmp_path)) for f in flags])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and says in lines[0], proc.stderr

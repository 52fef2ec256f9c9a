"""The bench runner, as a real subprocess: the smoke profile's outputs, and failures that become rows."""

import json
import tomllib

import pandas as pd
import pytest

from conftest import REPO, run

PNGS = ["throughput.png", "accuracy_vs_time.png", "memory.png", "data_wait.png"]


def _is_png(path):
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


def test_smoke_profile_writes_tables_and_plots(tmp_path):
    out = tmp_path / "smoke"
    proc = run("bench/bench.py", "--profile", "smoke", "--out", out, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    configs = [r["name"] for r in tomllib.loads((REPO / "bench/profiles.toml").read_text())["smoke"]["runs"]]
    summary = pd.read_csv(out / "summary.csv")
    assert summary.config.tolist() == configs  # one row per configuration, in matrix order
    assert (summary.status == "ok").all() and (summary.images_per_s > 0).all()
    assert summary.loc[summary.config == "train.py cnn", "speedup"].item() == 1.0
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == len(configs) and (runs.status == "ok").all()
    for log in runs.log:
        assert (out / log).read_text().startswith("$ ")
    table = (out / "table.md").read_text()
    assert "images/s" in table and "speed-up" in table and "torch" in table
    assert all(config in table for config in configs)
    assert json.loads((out / "env.json").read_text())["profile"] == "smoke"
    for name in PNGS:
        assert _is_png(out / name), name
    assert "| train.py cnn" in proc.stdout  # the table is printed at the end
    assert {"train.py", "train_DP.py", "train_DDP.py", "train_amp.py"} <= set(summary.script)
    ddp = summary[summary.script == "train_DDP.py"].iloc[0]
    assert ddp.world_size == 2 and ddp.gpus == 0 and ddp.global_batch == 128  # 2 gloo processes x 64
    assert "world size" in table and "GPUs" in table
    assert "## Training scripts" in table and "## Input pipelines (JPEG files)" in table  # the two tables
    loaders = summary[summary.script.str.startswith("loader")]
    assert set(loaders.loader) == {"torch DataLoader", "DALI cpu"} and len(loaders) == 4


def test_failures_become_rows_and_the_rest_still_runs(tmp_path):
    matrix = tmp_path / "matrix.toml"
    matrix.write_text("""
[t]
repeats = 1
timeout_s = 300
[[t.runs]]
name = "good"
script = "src/train.py"
args = ["--device", "cpu", "--dataset", "synthetic", "--image-size", "28", "--subset", "512", "--batch-size", "64",
        "--epochs", "1", "--warmup-steps", "2"]
baseline = "good"
[[t.runs]]
name = "crash"
script = "src/train.py"
args = ["--device", "cpu", "--data-dir", "/nonexistent/fashion-mnist"]
baseline = "good"
[[t.runs]]
name = "slow"
script = "src/train.py"
args = ["--device", "cpu", "--epochs", "50"]
timeout_s = 3
[[t.runs]]
name = "needs two gpus"
script = "src/train.py"
min_gpus = 64
""")
    out = tmp_path / "out"
    proc = run("bench/bench.py", "--profile", "t", "--matrix", matrix, "--out", out, timeout=600)
    assert proc.returncode == 1  # something failed: say so, after writing everything
    summary = pd.read_csv(out / "summary.csv").set_index("config")
    assert summary.loc["good", "status"] == "ok" and summary.loc["good", "images_per_s"] > 0
    assert summary.loc["crash", "status"] == "failed"
    assert "exit 2" in summary.loc["crash", "reason"] and "does not exist" in summary.loc["crash", "reason"]
    assert summary.loc["slow", "status"] == "timeout"
    assert summary.loc["needs two gpus", "status"] == "skipped"
    assert "needs ≥ 64 GPUs" in summary.loc["needs two gpus", "reason"]
    table = (out / "table.md").read_text()
    assert "failed: exit 2" in table and "timeout" in table and "skipped" in table
    for name in PNGS:
        assert _is_png(out / name), name


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--profile", "nope"], "profile 'nope' is not in"),
        (["--repeats", "0"], "--repeats"),
    ],
)
def test_bad_bench_flags_are_one_line(argv, fragment):
    proc = run("bench/bench.py", *argv, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and fragment in proc.stderr

"""The smoke profile through the bench runner, as a real subprocess: every script, the comparisons in interleaved
pairs, its tables, ladders, plots, provenance and side-by-side pages."""

import json
import tomllib

import pandas as pd
import pytest
from conftest import REPO, run
from test_bench import PNGS, _is_png

import common


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    proc = run("bench/bench.py", "--profile", "smoke", "--out", out, timeout=1200)  # its runs fork from its server
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, pd.read_csv(out / "summary.csv"), proc


def test_smoke_profile_writes_tables_and_plots(smoke):
    out, _, proc = smoke
    configs = [r["name"] for r in tomllib.loads((REPO / "bench/profiles.toml").read_text())["smoke"]["runs"]]
    summary = pd.read_csv(out / "summary.csv")
    assert summary.config.tolist() == configs  # one row per configuration, in matrix order
    assert (summary.status == "ok").all() and (summary.images_per_s > 0).all()
    runs = pd.read_csv(out / "runs.csv")
    assert (runs.status == "ok").all() and set(runs.config) == set(configs)
    assert runs.job.tolist() == sorted(runs.job) == list(range(len(runs)))  # every planned run, in order
    for log in runs.log:
        assert (out / log).read_text().startswith("$ ")
    table = (out / "table.md").read_text()
    assert "images/s" in table and "compared" in table and "torch" in table and "Provenance:" in table
    assert all(config in table for config in configs)
    assert json.loads((out / "env.json").read_text())["profile"] == "smoke"
    for name in PNGS:
        assert _is_png(out / name), name
    end = proc.stdout[proc.stdout.index("On this machine (") :].splitlines()  # the end: what pays here, in brief
    assert all(len(line) <= 100 for line in end) and "| train.py cnn" not in proc.stdout  # the table stays in table.md
    assert any(line.startswith("  train_amp.py cnn") and "× train.py" in line for line in end)
    assert {"train.py", "train_DP.py", "train_DDP.py", "train_amp.py", "train_fast.py"} <= set(summary.script)
    ddp = summary[summary.script == "train_DDP.py"].iloc[0]
    assert ddp.world_size == 2 and ddp.gpus == 0 and ddp.global_batch == 128  # 2 gloo processes x 64
    assert "world size" in table and "GPUs" in table
    assert "## Training scripts" in table and "## Input pipelines (JPEG files)" in table  # the two tables
    loaders = summary[summary.script.str.startswith("loader")]
    assert set(loaders.loader) == {"torch DataLoader", "DALI cpu"} and len(loaders) == 4
    assert set(summary.limited_by) <= {"input", "input (below ceiling)", "compute"}
    assert (loaders[loaders.loader_only.astype(str) == "True"].limited_by == "input").all()  # they only wait for data
    env = json.loads((out / "env.json").read_text())
    assert env["matrix"] == "bench/profiles.toml" and env["git"]["commit"] and "bf16_instructions" in env
    assert env["cpu_model"] in table and "bf16 instructions" in table.splitlines()[2]
    index = (out / "index.html").read_text()  # the side-by-side pages, with this run's comparisons
    amp = summary[summary.script == "train_amp.py"].iloc[0]
    assert 'href="diff-train_amp.html"' in index and f"{amp.speedup_rung:.2f}× (1 pair)" in index
    assert (out / "diff-train_amp.html").is_file() and "index.html" in proc.stdout


def test_smoke_runs_every_comparison_in_a_pair_and_gives_no_verdict_from_1(smoke):
    """Each comparison's two rows ran next to each other in the profile's one round (the alternating order of more
    rounds: tests/test_pairs.py); each pair's ratio is its runs' rates (global batch over the median block of
    steps), and the summary's cell is that ratio. With 1 pair no cell has a verdict and the header says the floor
    was not measured: both need 3 pairs."""
    out, summary, _ = smoke
    runs, plan = pd.read_csv(out / "runs.csv"), pd.read_csv(out / "pairs.csv")
    speed = dict(zip(runs.job, 1e3 * runs.global_batch / runs.step_ms_blocked, strict=True))  # the median block's
    for comparison, pairs in plan.groupby(["row", "reference", "kind"]):
        assert len(pairs) == 1, comparison
        steps = [int(a) - int(b) for a, b in zip(pairs.row_job, pairs.reference_job, strict=True)]
        assert abs(steps[0]) == 1  # adjacent
        assert pairs.ratio.tolist() == pytest.approx([speed[a] / speed[b] for a, b in
                                                      zip(pairs.row_job, pairs.reference_job, strict=True)])  # fmt: skip
    by_config = summary.set_index("config")
    self_pair = by_config.loc["train.py cnn, again"]
    ratios = plan[plan.kind == "same_as"].ratio
    assert self_pair.x_self == pytest.approx(ratios.median())
    # 1 round: no verdict (3 pairs needed) and no floor (3 self pairs needed), said in the cell and the header
    assert self_pair.x_self_verdict == "no verdict: 1 pair, 3 needed"
    assert "Noise floor: not measured (fewer than 3 undisturbed self pairs" in (out / "table.md").read_text()


def test_smoke_ladder_lists_every_rung_with_both_speedups(smoke):
    out, summary, _ = smoke
    ladder = (out / "ladder.md").read_text()
    assert _is_png(out / "ladder.png")
    rungs = ["train.py", "train_amp.py", "train_channels_last.py", "train_compile.py", "train_fast.py"]
    lines = [line for line in ladder.splitlines() if line.startswith("| ") and "×" in line]
    for script in rungs:
        assert any(line.startswith(f"| {script} ") for line in lines), script
    by_config = summary.set_index("config")
    plan = pd.read_csv(out / "pairs.csv")
    for config, base in [("train_compile.py cnn, float32", "train_channels_last.py cnn, float32"),
                         ("train_fast.py cnn, float32, data on the device", "train_compile.py cnn, float32")]:  # fmt: skip
        row = by_config.loc[config]
        ratios = plan[(plan.row == config) & (plan.kind == "rung_base")].ratio
        assert row.speedup_rung == pytest.approx(ratios.median())  # from its pairs, not from medians of runs
        line = next(line for line in lines if line.startswith(f"| {config} "))
        assert f"{row.speedup_rung:.2f}× (1 pair)" in line
        assert f"{row.speedup_rung_verdict} ({base})" in line and f"{row.speedup:.2f}×" in line
    fast = by_config.loc["train_fast.py cnn, float32, data on the device"]  # × train.py: the product of the links
    links = [by_config.loc[c].speedup_rung for c in ("train_amp.py cnn, autocast off",
             "train_channels_last.py cnn, float32", "train_compile.py cnn, float32")]  # fmt: skip
    assert fast.speedup == pytest.approx(fast.speedup_rung * links[0] * links[1] * links[2])
    assert "## Ladder: small CNN from JPEG files" in ladder  # the input ladder: loader.py -> loader_DALI.py


def test_smoke_memory_table_shows_activation_checkpointing_against_its_base_at_the_same_batch(smoke):
    """The memory table: train_activation_checkpointing.py against train.py, the small ViT at the same batch, each
    row's measured activation memory (saved_tensors_hooks) and images/s, the second against the first."""
    out, summary, _ = smoke
    table = (out / "table.md").read_text()
    assert "## Memory: small ViT, batch 32: activation checkpointing" in table
    by_config = summary.set_index("config")
    base = by_config.loc["train.py vit, synthetic 32 px"]
    ac = by_config.loc["train_activation_checkpointing.py vit, synthetic 32 px"]
    assert base.global_batch == ac.global_batch == 32
    assert 0 < ac.activation_mib < base.activation_mib / 2  # 3 of 4 blocks keep only their inputs
    vit = common.build_model("vit", 3, 32)  # the same model in both: the small ViT for 3 x 32 x 32
    assert base.params == ac.params == sum(p.numel() for p in vit.parameters())
    section = table.split("## Memory: small ViT, batch 32")[1].split("\n## ")[0]
    line = next(line for line in section.splitlines() if line.startswith("| train_activation_checkpointing.py"))
    assert f"{ac.activation_mib:.1f}" in line and f"{ac.activation_mib / base.activation_mib:.2f}×" in line
    assert f"{ac.x_memory:.2f}× (1 pair)" in line  # images/s, from its pair


def test_smoke_rows_carry_flops_and_their_share_of_the_measured_matmul_peak(smoke):
    """env.json holds the matmul peak measured before the runs (float32 and bfloat16 at least, TFLOP/s > 0); every
    training row has its FLOPs per image and TFLOP/s, and TFLOP/s = GFLOPs/image x images/s (the definition);
    table.md's of-peak column is that over the peak in the row's dtype (float32 or bfloat16 on a CPU)."""
    out, summary, _ = smoke
    env = json.loads((out / "env.json").read_text())
    peaks = env["gemm_peak_tflops"]
    assert {"float32", "bfloat16", "float16"} <= peaks.keys() and all(v > 0 for v in peaks.values())
    training = summary[~summary.script.str.startswith("loader")]
    assert (training.flops_per_image > 0).all() and (training.achieved_tflops > 0).all()
    runs = pd.read_csv(out / "runs.csv")
    runs = runs[~runs.script.str.startswith("loader")]
    assert (runs.achieved_tflops - runs.flops_per_image * runs.images_per_s / 1e12).abs().max() < 1e-9
    cnn = summary[summary.config == "train.py cnn"].iloc[0]
    table = (out / "table.md").read_text()
    assert (
        "of peak"
        in table.splitlines()[[i for i, line in enumerate(table.splitlines()) if "## Training" in line][0] + 2]
    )
    assert f"{cnn.achieved_tflops / peaks['float32']:.1%}" in table


def test_smoke_sweep_profile_trace_and_compile_count(smoke):
    """The batch-size sweep (two points, lr scaled linearly) has its table and sweeps.png; the train_profile.py row
    wrote its Chrome trace into the result folder ({out} in its args); train_compile.py compiled its graph once, at
    the first step, and no later step recompiled."""
    out, summary, _ = smoke
    table = (out / "table.md").read_text()
    section = table.split("## Sweep: batch size")[1].split("\n## ")[0]
    rows = [
        line for line in section.splitlines() if line.startswith("|") and "images/s" not in line and "---" not in line
    ]
    assert [line.split("|")[1].strip() for line in rows] == ["64", "128"]  # sorted by the knob
    assert "0.005" in rows[0] and "0.01" in rows[1]  # the learning rate, scaled with the batch
    assert _is_png(out / "sweeps.png")
    traces = list((out / "trace").glob("trace-*.json"))
    assert len(traces) == 1 and json.loads(traces[0].read_text())["traceEvents"]
    compiled = summary.set_index("config").loc["train_compile.py cnn, float32"]
    assert compiled.graphs_compiled >= 1 and compiled.recompiled_steps == 0

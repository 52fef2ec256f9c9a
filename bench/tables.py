"""The Markdown tables of a result folder: table.md (ladders, training, memory, sweeps, ablations, input
pipelines), ladder.md, and peak.md for an older folder."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
from cells import (
    RATIO_STATISTICS,
    acc_cell,
    cell_text,
    compiled_cell,
    fmt,
    hardware_line,
    ips_cell,
    noise_line,
    pair_cell,
    peak_cells,
    provenance_line,
    ratio_of,
    row_groups,
    status_cell,
    sweep_groups,
    wait_cell,
    x_cell,
)
from peak import count_flops_per_image, datasheet, of_datasheet, of_peak, peak_line
from profiles import KNOBS
from summary import BELOW_CEILING, INPUT_BOUND


def markdown(table: pd.DataFrame) -> str:
    """A DataFrame of formatted cells as a Markdown table, each cell as written: tabulate would otherwise re-parse
    "6.0" as a number and print "6"."""
    return table.to_markdown(index=False, disable_numparse=True)


def table_markdown(
    summary: pd.DataFrame, env: dict, profile: str, repeats: str, noise: dict | None = None, out=None, stop: str = ""
) -> str:
    """table.md: hardware, versions, commit and the noise floor (`noise`: the self pairs' ratios and the floor they
    give, see pairs.noise_floor) in the header, with `stop` after it (where the runs stopped before the plan's end,
    or a floor past --max-floor left every comparison without a verdict: bench.py's line; "" for none), then the
    ladder(s), the training table, the memory, sweep, ablation and input-pipeline tables."""
    is_loader = (
        summary.script.astype(str).str.startswith("loader")
        | summary.get("loader", pd.Series(index=summary.index, dtype=object)).notna().to_numpy()
    )
    started = env.get("started")  # when the runs began (env.json), not when the tables were written
    when = (datetime.fromisoformat(started) if started else datetime.now(timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    header = (
        f"# Benchmark, profile `{profile}` (run {when})\n\n{hardware_line(env)}\n\n{provenance_line(out, env)}\n\n"
        f"{noise_line(noise)}\n\n"
        + (f"{stop}\n\n" if stop else "")
        + "images/s: global (summed over processes), steady state (warm-up steps excluded), median over the row's runs "
        '(min–max in brackets when it ran more than once); "not measured" when a run had no step after its warm-up. '
        "Ratios (× its base, × the first rung, of its ceiling, × the whole, × the first row or point) come from "
        "interleaved pairs: the two rows ran next to each other, in alternating order (A B, then B A), and each pair "
        "gave one ratio; a cell reads median× (min–max over the pairs), verdict. "
        f"{RATIO_STATISTICS} × the first rung multiplies the "
        "links of the ladder down to its first rung (its range: the product of theirs). Rows in no comparison ran "
        f"{repeats}, apart. Limited by: input when the steps waited for data "
        f"{100 * INPUT_BOUND:.0f} % of the time or more; input (below ceiling) when they waited less but the row reached "
        f"under {100 * BELOW_CEILING:.0f} % of its ceiling (the same model on a synthetic batch already on the "
        "device): decoding takes the CPU time training needs, which data-wait does not show; else compute. "
        "World size: processes; GPUs: devices the run "
        "used (0 on CPU). Peak memory per device; host RSS of the training process. Test accuracy over the 10,000 "
        "Fashion-MNIST test images after the last epoch (loaders: over the folder's val/ images). First step: "
        "seconds of the first training step, where torch.compile compiles (its `compile_s`), cuDNN autotunes and "
        "workers start; time to target leaves compile_s out, the column after it includes it. On CPU, bfloat16 "
        "autocast is native with bf16 instructions and emulated (slow) without: see the CPU line above. "
        "GFLOPs/image: training FLOPs (forward + backward matmuls, convolutions, attention) counted with "
        "torch.utils.flop_counter on one step, as they ran (an activation-checkpointing recompute counts: hardware "
        "FLOPs), causal attention counted as its lower triangle (FlashAttention's convention); TFLOP/s: that x "
        "images/s, all devices together; of peak: over this machine's measured matmul peak "
        f"in the dtype the run computed in, per device used ({peak_line(env)}): how much of the hardware the run "
        "uses, the rest is what is left to gain"
        + (f"; of datasheet: over the GPU's dense peak in that dtype ({datasheet(env)[1]})" if datasheet(env) else "")
        + ".\n\n"
    )
    is_ablation = summary.ablation_of.map(cell_text).to_numpy() != ""
    text = header + ladder_markdown(summary, env)
    if (~is_loader & ~is_ablation).any():
        text += "## Training scripts\n\n" + _training_table(summary[~is_loader & ~is_ablation], env) + "\n"
    text += memory_markdown(summary, env) + sweep_markdown(summary)
    if is_ablation.any():
        text += (
            "## Ablations: one change left out\n\nEach row runs a configuration with one of its changes left out "
            "(train_fast.py --without X); × the whole: its images/s over the whole configuration's; the change "
            "buys: the inverse, the speed-up that change alone is worth there.\n\n"
            + _ablation_table(summary[is_ablation])
            + "\n"
        )
    if is_loader.any():
        text += "## Input pipelines (JPEG files)\n\n" + _loader_table(summary[is_loader], env) + "\n"
    return text


def ladder_markdown(summary: pd.DataFrame, env: dict | None = None) -> str:
    """One table per ladder of the profile (rows with `ladder = NAME`, in matrix order): each rung's images/s, its
    speed-up over its base rung (the lesson of that step, from interleaved pairs, with spread and verdict) and over
    the ladder's first rung (the product of the links), TFLOP/s and share of the peak (`env`'s), what torch.compile
    compiled, peak memory and, for a row run to a target accuracy, the time to it."""
    text = ""
    for name, rungs in row_groups(summary, "ladder"):
        rows = []
        first = rungs.iloc[0]
        for r in rungs.to_dict("records"):
            on_cpu = r.get("device") == "cpu"
            rows.append(
                {
                    "rung": r["config"],
                    "technique": (cell_text(r.get("technique")) or "–"),
                    "precision": (cell_text(r.get("precision")) or "–"),
                    "images/s": ips_cell(r),
                    "× its base": pair_cell(r, "speedup_rung")
                    + (f" ({cell_text(r.get('rung_base'))})" if cell_text(r.get("rung_base")) else ""),
                    f"× {first['script']}": pair_cell(r, "speedup") if r["config"] != first["config"] else "1.00×",
                    "of its ceiling": pair_cell(r, "of_ceiling"),
                    "limited by": (cell_text(r.get("limited_by")) or "–"),
                    **peak_cells(r, env or {}),
                    "compiled": compiled_cell(r),
                    "peak mem (GiB)": ("host " + fmt(r.get("peak_host_rss_gib"), ".2f"))
                    if on_cpu
                    else fmt(r.get("peak_mem_allocated_gib"), ".2f"),
                    "time to target (s)": fmt(r.get("time_to_target_s"), ".1f"),
                    "incl. compile (s)": fmt(r.get("time_to_target_incl_compile_s"), ".1f"),
                    "steps to target": fmt(r.get("steps_to_target"), ".0f"),
                    "× sooner to target": pair_cell(r, "x_target"),
                    "status": status_cell(r),
                }
            )
        table = pd.DataFrame(rows)
        table = table[[c for c in table.columns if c == "rung" or (table[c] != "–").any()]]  # drop empty columns
        text += f"## Ladder: {name}\n\n" + markdown(table) + "\n\n"
    return text


def sweep_markdown(summary: pd.DataFrame) -> str:
    """One table per sweep (rows with `sweep = NAME` and `knob`, in matrix order): the knob's value, images/s and
    × the first point, data-wait, step time, the learning rate (a batch-size sweep scales it linearly) and test
    accuracy."""
    text = ""
    for name, rows, knob in sweep_groups(summary):
        first = next(c for c in summary.config if c in set(rows.config))  # the first point in matrix order
        table = [
            {
                KNOBS.get(knob, knob): fmt(r.get(knob), ".6g"),
                "images/s": ips_cell(r),
                "× the previous point": pair_cell(r, "x_sweep"),
                "× the first point": pair_cell(r, "x_sweep_first").split(",")[0] if r["config"] != first else "1.00×",
                "data-wait": wait_cell(r),
                "step p50 (ms)": fmt(r.get("step_ms_p50"), ".1f"),
                "lr": fmt(r.get("lr"), ".3g"),
                "test acc": acc_cell(r),
                "status": status_cell(r),
            }
            for r in rows.to_dict("records")
        ]
        text += (
            f"## Sweep: {name}\n\nOne knob varied, everything else fixed; images/s against it, with data-wait beside "
            "it (sweeps.png plots both); × the previous point: images/s over the point before it in the matrix, from "
            f"interleaved pairs; × the first point ({first}): the product of those links.\n\n"
            + markdown(pd.DataFrame(table))
            + "\n\n"
        )
    return text


def memory_markdown(summary: pd.DataFrame, env: dict | None = None) -> str:
    """One table per memory comparison of the profile (rows with `memory = NAME`, in matrix order; the first is the
    reference): parameters per process, activation memory (what autograd kept for backward in one step, measured),
    peak memory per process, images/s, and each against the reference's."""
    text = ""
    for name, rows in row_groups(summary, "memory"):
        first = rows.iloc[0]
        table = []
        for r in rows.to_dict("records"):
            on_cpu = r.get("device") == "cpu"
            per_rank = r.get("params_per_rank") if pd.notna(r.get("params_per_rank")) else r.get("params")
            table.append(
                {
                    "configuration": r["config"],
                    "technique": (cell_text(r.get("technique")) or "–"),
                    "world size": fmt(r.get("world_size"), ".0f"),
                    "global batch": fmt(r.get("global_batch"), ".0f"),
                    "params per process": fmt(per_rank, ",.0f"),
                    "activations (MiB)": fmt(r.get("activation_mib"), ".1f"),
                    "activations ×": x_cell(ratio_of(r.get("activation_mib"), first.get("activation_mib"))),
                    "peak per process (GiB)": ("host " + fmt(r.get("peak_host_rss_gib"), ".2f"))
                    if on_cpu
                    else fmt(r.get("peak_mem_allocated_gib"), ".2f"),
                    "images/s": ips_cell(r),
                    "images/s ×": pair_cell(r, "x_memory") if r["config"] != first["config"] else "1.00×",
                    **peak_cells(r, env or {}),
                    "status": status_cell(r),
                }
            )
            if "ac_mode" in rows and rows["ac_mode"].notna().any():  # activation checkpointing: what it recomputes
                table[-1]["FLOPs per sample ×"] = x_cell(
                    ratio_of(r.get("flops_per_image"), first.get("flops_per_image"))
                )
            if "pad_share" in rows and rows["pad_share"].notna().any():  # variable-length batches
                table[-1]["pad share"] = fmt(r.get("pad_share"), ".1%")
            if "allreduce_mib_per_step" in rows and rows["allreduce_mib_per_step"].notna().any():  # comm hooks
                table[-1]["all-reduced per step (MiB)"] = fmt(r.get("allreduce_mib_per_step"), ".2f")
            if "compile_s" in rows and rows["compile_s"].notna().all():  # compiled rows only: whole or regional
                table[-1]["compile (s)"] = fmt(r.get("compile_s"), ".1f")
                table[-1]["graphs compiled"] = fmt(r.get("graphs_compiled"), ".0f")
            if "checkpoint_s" in rows and rows["checkpoint_s"].notna().any():  # sync / async checkpoints
                table[-1]["stall per checkpoint (s)"] = fmt(
                    ratio_of(r.get("checkpoint_s"), r.get("checkpoints")), ".3f"
                )
            if "bubble_theory" in rows and rows["bubble_theory"].notna().any():  # a pipeline row: its idle share
                table[-1]["pipeline bubble (measured / theory)"] = (
                    f"{fmt(r.get('bubble_measured'), '.0%')} / {fmt(r.get('bubble_theory'), '.0%')}"
                    if pd.notna(r.get("bubble_theory"))
                    else "–"
                )
        text += (
            f"## Memory: {name}\n\nActivations: the memory of the tensors autograd kept for backward in one "
            "training step, per process (measured with saved_tensors_hooks on the meter's probe step, the second, run eagerly); params per process: "
            "what one process holds (FSDP shards them, TP splits every block, a pipeline stage holds its blocks); "
            "× the first row's."
            + (
                " A pipeline's bubble: the share of a step its processes computed nothing (timed around each stage's "
                "compute calls, the mean over the processes) against the theory's: (p - 1) / (v m + p - 1) for p "
                "processes of v stages and m micro-batches, (p - 1) / (3 v m + p - 1) for a zero-bubble schedule."
                if "pipeline bubble (measured / theory)" in table[-1]
                else ""
            )
            + (
                " FLOPs per sample: the matmuls, convolutions and attention of one training step as they ran "
                "(torch.utils.flop_counter, causal attention as its lower triangle; a recompute counts, a selective "
                "recompute served from its cache does not), × the first row's."
                if "FLOPs per sample ×" in table[-1]
                else ""
            )
            + (
                " Pad share: the share of the training batches' tokens that were padding; tokens/s counts real tokens "
                "only, and activations are the first batch's (its length varies)."
                if "pad share" in table[-1]
                else ""
            )
            + (
                " Compile: the first step's seconds, where torch.compile compiles (median over the runs)."
                if "compile (s)" in table[-1]
                else ""
            )
            + (
                " Stall per checkpoint: the seconds rank 0's training loop stood still for each sharded save (an "
                "async save: staging, and the wait for the one before)."
                if "stall per checkpoint (s)" in table[-1]
                else ""
            )
            + (
                " All-reduced per step: the size of what each process hands to its all-reduces in one step (the "
                "gradients, 4 bytes an element in float32, 2 in bfloat16 / float16; PowerSGD's low-rank factors)."
                if "all-reduced per step (MiB)" in table[-1]
                else ""
            )
            + "\n\n"
            + markdown(pd.DataFrame(table))
            + "\n\n"
        )
    return text


def _loader_table(summary: pd.DataFrame, env: dict | None = None) -> str:
    """One row per input-pipeline configuration: pipeline, workers / threads, loader-only or end to end, data-wait."""
    rows = []
    for r in summary.to_dict("records"):
        loader_only = str(r.get("loader_only")).lower() == "true"
        on_cpu = r.get("device") == "cpu"
        rows.append(
            {
                "configuration": r["config"],
                "script": r["script"],
                "pipeline": (cell_text(r.get("loader")) or "–"),
                "workers / threads": fmt(r.get("workers"), ".0f"),
                "measures": "loader only" if loader_only else f"end to end ({r.get('model') or '–'})",
                "data": (cell_text(r.get("dataset")) or "–"),
                "crop (px)": fmt(r.get("image_size"), ".0f"),
                "device": (cell_text(r.get("device")) or "–"),
                "batch": fmt(r.get("global_batch"), ".0f"),
                "precision": "–" if loader_only else (cell_text(r.get("precision")) or "–"),
                "images/s": ips_cell(r),
                "× its base": pair_cell(r, "speedup_rung"),
                "step p50 (ms)": fmt(r.get("step_ms_p50"), ".1f"),
                "data-wait": wait_cell(r),
                "limited by": (cell_text(r.get("limited_by")) or "–"),
                "of its ceiling": pair_cell(r, "of_ceiling"),
                **peak_cells(r, env or {}),
                "peak alloc (GiB)": "n/a (CPU)" if on_cpu else fmt(r.get("peak_mem_allocated_gib"), ".2f"),
                "host RSS (GiB)": fmt(r.get("peak_host_rss_gib"), ".2f"),
                "test acc": acc_cell(r),
                "status": status_cell(r),
            }
        )
    return markdown(pd.DataFrame(rows)) + "\n"


def _ablation_table(summary: pd.DataFrame) -> str:
    """One row per ablation: the configuration left out of, images/s, over the whole, what the change buys."""
    rows = [
        {
            "configuration": r["config"],
            "one change left out of": cell_text(r.get("ablation_of")),
            "images/s": ips_cell(r),
            "× the whole": pair_cell(r, "of_whole"),
            "the change buys": pair_cell(r, "of_whole", inverse=True),
            "step p50 (ms)": fmt(r.get("step_ms_p50"), ".1f"),
            "data-wait": wait_cell(r),
            "test acc": acc_cell(r),
            "status": status_cell(r),
        }
        for r in summary.to_dict("records")
    ]
    return markdown(pd.DataFrame(rows)) + "\n"


def _training_table(summary: pd.DataFrame, env: dict) -> str:
    """One row per training configuration; `env` gives the measured matmul peaks (of-peak column)."""
    rows = []
    for r in summary.to_dict("records"):
        on_cpu = r.get("device") == "cpu"
        rows.append(
            {
                "configuration": r["config"],
                "script": r["script"],
                "model": (cell_text(r.get("model")) or "–"),
                "data": (cell_text(r.get("dataset")) or "–"),
                "device": (cell_text(r.get("device")) or "–"),
                "world size": fmt(r.get("world_size"), ".0f"),
                "GPUs": fmt(r.get("gpus"), ".0f"),
                "global batch": fmt(r.get("global_batch"), ".0f"),
                "precision": (cell_text(r.get("precision")) or "–"),
                "images/s": ips_cell(r),
                "compared": compared_cell(r),
                "step p50 (ms)": fmt(r.get("step_ms_p50"), ".1f"),
                "data-wait": wait_cell(r),
                "limited by": (cell_text(r.get("limited_by")) or "–"),
                "peak alloc (GiB)": "n/a (CPU)" if on_cpu else fmt(r.get("peak_mem_allocated_gib"), ".2f"),
                "peak reserved (GiB)": "n/a (CPU)" if on_cpu else fmt(r.get("peak_mem_reserved_gib"), ".2f"),
                "host RSS (GiB)": fmt(r.get("peak_host_rss_gib"), ".2f"),
                "activations (MiB)": fmt(r.get("activation_mib"), ".1f"),
                "GFLOPs/image": fmt(r.get("flops_per_image"), ".3g", 1e-9),
                **peak_cells(r, env),
                "test acc": acc_cell(r),
                "first step (s)": fmt(r.get("first_step_s"), ".1f"),
                "time to target (s)": fmt(r.get("time_to_target_s"), ".1f"),
                "incl. compile (s)": fmt(r.get("time_to_target_incl_compile_s"), ".1f"),
                "steps to target": fmt(r.get("steps_to_target"), ".0f"),
                "× sooner to target": pair_cell(r, "x_target"),
                "status": status_cell(r),
            }
        )
    table = pd.DataFrame(rows)
    unused = [c for c in ("steps to target", "× sooner to target") if (table[c] == "–").all()]  # no run to a target
    return markdown(table.drop(columns=unused)) + "\n"


def peak_table(out: Path) -> str:
    """peak.md for a result folder measured before the runs counted their FLOPs (or on a GPU this machine does not
    have): every ok row's GFLOPs per image (from its metrics, else counted here with `count_flops_per_image` from
    its model and input shape), its TFLOP/s (that x its images/s) and the share of the datasheet's dense peak of its
    GPU in its dtype (DATASHEET_PEAKS) and of the measured matmul peak when env.json has one. Raises OSError /
    ValueError when OUT has no runs.csv or env.json."""
    runs, env = pd.read_csv(out / "runs.csv", dtype={"config": str}), json.loads((out / "env.json").read_text())
    counted, rows = {}, []
    for r in runs[runs.status == "ok"].to_dict("records"):
        path = out / "metrics" / Path(str(r["log"])).with_suffix(".json").name
        record = json.loads(path.read_text())
        if not isinstance(record, dict):
            raise ValueError(f"{path} is not a run's metrics (a JSON object)")
        resolved = dict(record["args"]) if isinstance(record.get("args"), dict) else {}
        argv = str(r.get("command", "")).split()  # older metrics have no resolved args: the command line has them
        for flag in ("--model", "--image-size"):
            if flag in argv[:-1] and not resolved.get(flag[2:].replace("-", "_")):
                resolved[flag[2:].replace("-", "_")] = argv[argv.index(flag) + 1]
        model = record.get("model") or resolved.get("model")
        if not model or model not in ("mlp", "cnn", "resnet18", "resnet50", "vit"):
            continue  # a loader-only row trains no model
        fashion_mnist = record.get("dataset") == "fashion-mnist" and not str(record.get("script")).startswith("loader")
        channels = 1 if fashion_mnist else 3  # common.input_shape; the loaders read RGB JPEGs
        try:
            size = 28 if fashion_mnist else int(record.get("image_size") or resolved.get("image_size") or 224)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{path}: image_size {record.get('image_size')!r} is not a number of pixels") from None
        if not 0 < size <= 4096:
            raise ValueError(f"{path}: image_size {size} is not a side in pixels")
        flops, where = record.get("flops_per_image"), "in the run"
        if not (isinstance(flops, int | float) and not isinstance(flops, bool) and 0 < flops < float("inf")):
            key = (model, channels, size)
            counted.setdefault(key, count_flops_per_image(*key))
            flops, where = counted[key], "counted here"
        achieved = flops * r["images_per_s"] / 1e12
        rows.append(
            {
                "configuration": r["config"],
                "model": model,
                "input": f"{channels}x{size}x{size}",
                "precision": (cell_text(r.get("precision")) or "–"),
                "images/s": fmt(r["images_per_s"], ",.1f"),
                "GFLOPs/image": f"{flops / 1e9:.3g} ({where})",
                "TFLOP/s": fmt(achieved, ".3g"),
                "of peak": fmt(of_peak(achieved, r.get("precision"), env, model, r.get("gpus") or 0), ".1%"),
                "of datasheet": fmt(of_datasheet(achieved, r.get("precision"), env, model, r.get("gpus") or 0), ".1%"),
            }
        )
    sheet = datasheet(env)
    return (
        f"# Where the rows stand against the peak\n\n{hardware_line(env)}\n\n"
        "Written by `python bench/bench.py --peak-table OUT` from this folder's runs.csv, metrics/ and env.json: "
        "GFLOPs/image are training FLOPs (forward + backward) counted with torch.utils.flop_counter, in the run or, "
        "for a run made before the runs counted them, here on the CPU from the model and its input shape (the count "
        "does not depend on the device or dtype); TFLOP/s = that x images/s; of peak: over this machine's measured "
        f"matmul peak in the run's dtype ({peak_line(env)}); of datasheet: over "
        + (f"the GPU's dense peak in that dtype ({sheet[1]})" if sheet else "a datasheet (none known for this device)")
        + ". A dtype: amp float16 / bfloat16 rows against the 16-bit tensor-core peak; fp32 rows with TF32 "
        "convolutions against TF32 (the MLP and ViT, whose matmuls stay float32, against FP32).\n\n"
        + markdown(pd.DataFrame(rows))
        + "\n"
    )


def compared_cell(r: dict) -> str:
    """A training row's comparison for the training table: over its rung's base, else the whole configuration it
    leaves a change out of, its memory table's or sweep's first row; "–" when it was in no comparison."""
    for column, key in (("x_self", "same_as"), ("speedup_rung", "rung_base"), ("of_whole", "ablation_of"),
                        ("x_memory", "memory"), ("x_sweep", "sweep")):  # fmt: skip
        if pd.notna(r.get(column)):
            what = (
                cell_text(r.get(key))
                if key in ("same_as", "rung_base", "ablation_of")
                else f"its {'memory table' if key == 'memory' else 'sweep'}'s {'first row' if key == 'memory' else 'previous point'}"
            )
            return f"{pair_cell(r, column)} over {what}"
    return "–"

"""The text of a table cell (numbers with units, ratios, statuses) and the header line that names the hardware:
shared by the tables and the plots."""

from __future__ import annotations

import numpy as np
import pandas as pd
from peak import datasheet, of_datasheet, of_peak


def cpu_line(env: dict) -> str:
    """The CPU, its core count and whether it has bf16 instructions (which decide whether bf16 autocast is fast)."""
    flags = ", ".join(env.get("cpu_flags") or []) or "none of avx2/avx512f/avx512_bf16/amx"
    bf16 = "with" if env.get("bf16_instructions") else "without"
    return f"{env.get('cpu_model') or env.get('cpu')}, {env['cpu_count']} cores, {bf16} bf16 instructions ({flags})"


def hardware_line(env: dict) -> str:
    """One line naming the hardware, versions and commit, for the table's header."""
    if env["gpu_count"]:
        names = sorted(set(env["gpus"]))
        info = (env.get("gpu_info") or [{}])[0]
        driver = f", driver {info['driver']}" if info.get("driver") else ""
        hw = f"{env['gpu_count']} × {' + '.join(names)}{driver} · CPU: {cpu_line(env)}"
    else:
        hw = f"CPU only: {cpu_line(env)}, no GPU"
    git = env.get("git") or {}
    commit = (git.get("commit") or "unknown")[:10] + (" (dirty)" if git.get("dirty") else "")
    return (
        f"{hw} · torch {env['torch']} · torchvision {env['torchvision']} · CUDA {env['cuda'] or '–'} · "
        f"cuDNN {env['cudnn'] or '–'} · DALI {env['dali'] or '–'} · Python {env['python']} · host {env['hostname']} · "
        f"commit {commit}"
    )


def fmt(value, spec: str, scale: float = 1.0, missing: str = "–") -> str:
    try:
        if value is None or pd.isna(value):
            return missing
        return format(float(value) * scale, spec)
    except (TypeError, ValueError):
        return missing


def peak_cells(r: dict, env: dict) -> dict:
    """A row's FLOP/s cells: TFLOP/s achieved, its share of the measured matmul peak and, for a GPU with a known
    datasheet, of the datasheet's dense peak."""
    args = (r.get("achieved_tflops"), r.get("precision"), env, r.get("model"), r.get("gpus") or 0)
    cells = {"TFLOP/s": fmt(r.get("achieved_tflops"), ".3g"), "of peak": fmt(of_peak(*args), ".1%")}
    if datasheet(env):
        cells["of datasheet"] = fmt(of_datasheet(*args), ".1%")
    return cells


def row_groups(summary: pd.DataFrame, key: str) -> list[tuple[str, pd.DataFrame]]:
    """(name, rows in matrix order) per group of `key` ("ladder", "memory", "sweep"); a row's ladder cell may name
    several ladders, joined by " | " (train.py is the first rung of the bf16 and of the float32 ladder)."""
    names = [[n for n in cell_text(v).split(" | ") if n] for v in summary[key]]
    order = list(dict.fromkeys(n for row in names for n in row))
    return [(n, summary[[n in row for row in names]]) for n in order]


def compiled_cell(r: dict) -> str:
    """torch.compile's count: graphs compiled and the later steps that recompiled (kept out of images/s)."""
    graphs = r.get("graphs_compiled")
    if graphs is None or pd.isna(graphs):
        return "–"
    return f"{graphs:.0f} graph(s), {fmt(r.get('recompiled_steps'), '.0f', missing='0')} recompile(s)"


def sweep_groups(summary: pd.DataFrame) -> list[tuple[str, pd.DataFrame, str]]:
    """(name, rows sorted by the knob's value, knob) per sweep of the summary."""
    sweeps = []
    for name, rows in row_groups(summary, "sweep"):
        first = rows.iloc[0]
        knob = cell_text(first.knob).split(" | ")[cell_text(first.sweep).split(" | ").index(name)]
        order = pd.to_numeric(rows[knob], errors="coerce") if knob in rows else pd.Series(range(len(rows)))
        sweeps.append((name, rows.iloc[np.argsort(order.to_numpy(dtype=float), kind="stable")], knob))  # NaN last
    return sweeps


def ratio_of(a, b):
    try:
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        return None
    return a / b if b and not pd.isna(a) and not pd.isna(b) else None


def x_cell(value) -> str:
    return fmt(value, ".2f") + ("×" if value is not None and pd.notna(value) else "")


def acc_cell(r: dict) -> str:
    if r.get("dataset") == "synthetic":
        return "synthetic"
    if str(r.get("loader_only")).lower() == "true":
        return "–"
    return fmt(r.get("test_acc"), ".2f", 100) + (" %" if pd.notna(r.get("test_acc")) else "")


def ips_cell(r: dict) -> str:
    if r.get("status") == "ok" and (r.get("images_per_s") is None or pd.isna(r.get("images_per_s"))):
        return "not measured"
    ips = fmt(r.get("images_per_s"), ".1f")
    if r.get("runs_ok", 0) > 1:
        ips += f" ({fmt(r.get('images_per_s_min'), '.0f')}–{fmt(r.get('images_per_s_max'), '.0f')})"
    return ips


def cell_text(value) -> str:
    """A table cell's text: "" for None and NaN (what an empty cell of a CSV reads back as)."""
    return "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)


def status_cell(r: dict) -> str:
    reason, note = cell_text(r.get("reason")), cell_text(r.get("note"))
    return r["status"] + (f": {reason}" if reason else "") + (f" ({note})" if note else "")


def wait_cell(r: dict) -> str:
    return fmt(r.get("data_wait_frac"), ".1f", 100) + (" %" if pd.notna(r.get("data_wait_frac")) else "")

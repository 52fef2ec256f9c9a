"""The text of a table cell (numbers with units, ratios, statuses) and the header line that names the hardware:
shared by the tables and the plots."""

from __future__ import annotations

import numpy as np
import pandas as pd
from pairs import NOISY_FLOOR
from peak import datasheet, of_datasheet, of_peak


def cpu_kind(env: dict) -> str:
    """The kind of CPU a run had, as the pages name it: "AMX", "AVX512-BF16" or "AVX2 only" from its flags, and
    "AVX512-BF16, limited to AVX2" where torch's kernels were kept below the bf16 instructions it has
    (env.json's `isa_limits`, common.env.ISA_LIMITS): what a CPU without them runs, on one that has them."""
    flags = env.get("cpu_flags") or []
    kind = "AMX" if "amx_tile" in flags else "AVX512-BF16" if "avx512_bf16" in flags else "AVX2 only"
    limits = env.get("isa_limits") or {}
    if limits and kind != "AVX2 only" and not env.get("bf16_native", True):
        kind += f", limited to {limits.get('ONEDNN_MAX_CPU_ISA') or next(iter(limits.values()))}"
    return kind


def cpu_line(env: dict) -> str:
    """The CPU, its core count and whether it has bf16 instructions (which decide whether bf16 autocast is fast), and
    the variables that limited torch's kernels, where set."""
    flags = ", ".join(env.get("cpu_flags") or []) or "none of avx2/avx512f/avx512_bf16/amx"
    bf16 = "with" if env.get("bf16_instructions") else "without"
    line = f"{env.get('cpu_model') or env.get('cpu')}, {env['cpu_count']} cores, {bf16} bf16 instructions ({flags})"
    limits = env.get("isa_limits") or {}
    if limits:
        native = "bfloat16 emulated" if not env.get("bf16_native", True) else "bfloat16 native"
        line += f", limited by {' '.join(f'{k}={v}' for k, v in limits.items())} ({native})"
    return line


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
    rate = r.get("images_per_s")
    if rate is None or (isinstance(rate, float) and pd.isna(rate)):
        return "–"  # not measured: no unit to name (a skipped GPT rung once read "– images/s")
    tokens = r.get("tokens_per_sample")
    if tokens is not None and pd.notna(tokens) and tokens > 0:  # a language model: tokens/s, as the field counts
        ips = fmt(r.get("images_per_s"), ",.0f", tokens) + " tokens/s"
        if r.get("runs_ok", 0) > 1:
            ips += f" ({fmt(r.get('images_per_s_min'), '.0f', tokens)}–{fmt(r.get('images_per_s_max'), '.0f', tokens)})"
        return ips
    ips = fmt(r.get("images_per_s"), ".1f")
    if r.get("runs_ok", 0) > 1:
        ips += f" ({fmt(r.get('images_per_s_min'), '.0f')}–{fmt(r.get('images_per_s_max'), '.0f')})"
    return ips


def rate_text(r: dict) -> str:
    """A row's median rate with its unit: "26,427 tokens/s" for a language model (images_per_s x tokens_per_sample:
    a sample is a block of tokens), "432.0 images/s" for the others, "–" where it was not measured."""
    rate = r.get("images_per_s")
    if rate is None or (isinstance(rate, float) and pd.isna(rate)):
        return "–"  # not measured: no unit to name (a skipped GPT rung once read "– images/s")
    tokens = r.get("tokens_per_sample")
    if tokens is not None and pd.notna(tokens) and tokens > 0:
        return fmt(r.get("images_per_s"), ",.0f", tokens) + " tokens/s"
    return fmt(r.get("images_per_s"), ",.1f") + " images/s"


def cell_text(value) -> str:
    """A table cell's text: "" for None and NaN (what an empty cell of a CSV reads back as)."""
    return "" if value is None or (isinstance(value, float) and pd.isna(value)) else str(value)


def status_cell(r: dict) -> str:
    reason, note = cell_text(r.get("reason")), cell_text(r.get("note"))
    return r["status"] + (f": {reason}" if reason else "") + (f" ({note})" if note else "")


def wait_cell(r: dict) -> str:
    return fmt(r.get("data_wait_frac"), ".1f", 100) + (" %" if pd.notna(r.get("data_wait_frac")) else "")


def pair_cell(r: dict, column: str, inverse: bool = False) -> str:
    """A comparison's cell from the summary's `column` (and its _lo, _hi, _pairs, _verdict): "1.37× (1.33–1.42),
    faster"; "1.37× (1 pair)" from one pair; "–" without any. `inverse`: 1 / the ratio (an ablation's "the change
    buys"), its range and verdict turned round."""
    median, lo, hi = (r.get(column + suffix) for suffix in ("", "_lo", "_hi"))
    judged = cell_text(r.get(column + "_verdict"))
    if median is None or pd.isna(median):
        return judged if judged == "disturbed" else "–"
    if inverse:
        median, lo, hi = 1 / median, 1 / hi, 1 / lo
        judged = {"faster": "slower", "slower": "faster"}.get(judged, judged)
    n, left_out = r.get(column + "_pairs"), r.get(column + "_disturbed")
    spread = f" ({lo:.2f}–{hi:.2f})" if pd.notna(n) and n > 1 else " (1 pair)"
    gone = int(left_out) if left_out is not None and pd.notna(left_out) else 0
    note = f" ({gone} disturbed pair{'s' * (gone != 1)} left out)" if gone and judged != "disturbed" else ""
    return f"{median:.2f}×{spread}" + (f", {judged}" if judged else "") + note


def noise_line(noise: dict | None) -> str:
    """The table header's line on the noise floor: what the self pairs (a configuration against a copy of itself)
    measured, and what that makes a verdict; where runs went to a target, a second line on their times' floor."""
    line = _rate_noise_line(noise)
    if noise and "target_floor" in noise:
        ratios = "; ".join(
            f"{row} against {ref}: " + (", ".join(f"{r:.3f}" for r in rs) or "no undisturbed pair")
            for row, ref, rs in noise.get("target_self_pairs", [])
        )
        floor = noise["target_floor"]
        line += "\n\n" + (
            f"Time to the target: its noise floor ±{100 * floor:.1f} % ({ratios}); × sooner = the reference's seconds "
            "over the row's, judged against it as the rates are."
            if floor is not None
            else f"Time to the target: no noise floor ({ratios or 'no self pair ran to the target'}): no verdict."
        )
    return line


def _rate_noise_line(noise: dict | None) -> str:
    pairs = "; ".join(
        f"{row} against {reference}: " + (", ".join(f"{r:.3f}" for r in ratios) or "no undisturbed pair")
        for row, reference, ratios in (noise or {}).get("self_pairs", [])
    )
    if not noise or noise.get("floor") is None:
        why = f"fewer than 3 undisturbed self pairs ({pairs})" if pairs else "no self pair ran"
        return f"Noise floor: not measured ({why}): no comparison gets a verdict."
    floor = noise["floor"]
    if floor > NOISY_FLOOR:
        return (
            f"Noise floor: ±{100 * floor:.1f} %, the farthest from 1.00× that a configuration measured against a "
            f"copy of itself came ({pairs}; a pair far from its siblings is re-run and left out): wider than "
            f"±{100 * NOISY_FLOOR:.0f} %. A comparison is **faster** or **slower** only when every one of its "
            f"undisturbed pair ratios (3 or more) lies beyond 1.00× ± {floor:.3f}; the others read **no verdict**, "
            "not \"no measurable difference\": these windows cannot resolve a smaller effect on this machine."
        )
    return (
        f"Noise floor: ±{100 * floor:.1f} %, the farthest from 1.00× that a configuration measured against a copy of "
        f"itself came ({pairs}; a pair far from its siblings is re-run and left out). A comparison is **faster** or "
        f"**slower** only when every one of its undisturbed pair ratios (3 or more) lies beyond 1.00× ± "
        f"{floor:.3f}, else **no measurable difference**, whatever its median says; **disturbed** when re-runs left "
        "it fewer than 3 undisturbed pairs."
    )


RATIO_STATISTICS = (
    "A ratio and the rates beside it are different statistics: a ratio is the median of its pairs' ratios (a pair's "
    "speed ratio from its two runs' median blocks of steps), a rate the median of the row's runs over their whole "
    "windows; so × its base need not equal the ratio of the two rates shown, and the two differ where the pairs "
    "spread or a row's runs moved."
)  # the header of table.md and ladder.md says so where a reader sees both


def folder_commit(out, env: dict) -> tuple[str | None, bool | None, str]:
    """(commit, dirty, where it is recorded) of the code that made the result folder `out`: its provenance.json's
    commit when there is one (a correction, with its reason in its `note`: e.g. a GPU machine whose stale .git named
    the wrong commit), else env.json's `git`."""
    import json
    from pathlib import Path

    override = Path(out) / "provenance.json" if out is not None else None
    if override is not None and override.is_file():
        record = json.loads(override.read_text())
        return record.get("commit"), record.get("dirty"), f"provenance.json ({record.get('note', '')})"
    git = env.get("git") or {}
    return git.get("commit"), git.get("dirty"), "env.json"


def provenance_line(out, env: dict) -> str:
    """The folder's provenance for the table's header, in words that stay true when src/ changes: the commit of the
    scripts that made it, whether their tree was clean, where the commit was read (env.json, or provenance.json's
    correction), and the command that shows what src/ has changed since. No git is run: what changed is git's to
    say on the day it is asked, not the page's."""
    commit, dirty, where = folder_commit(out, env)
    if not commit:
        return "Provenance: no commit recorded (env.json names none)."
    short = commit[:10]
    tree = {True: ", with uncommitted changes", False: ", a clean tree"}.get(dirty, "")
    source = "provenance.json: a correction of env.json, its note says why" if where.startswith("provenance") else where
    if dirty is None:
        source += ", which does not record whether that tree was clean"
    return (
        f"Provenance: made by the scripts of commit {short}{tree} (read from {source}); what src/ has changed "
        f"since: `git diff --stat {short} -- src/`."
    )

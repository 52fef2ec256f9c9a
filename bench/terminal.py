"""What a bench run prints at its end: the few lines a user came for, within 100 columns, where table.md has rows
of 20 to 30 columns. On this machine: each ladder rung's ratio over its base and its verdict (what pays here, what
does not), the noise floor, the other comparisons in a line each, the rows that did not run, and where the tables,
plots and side-by-side pages are. Every ratio and verdict is the cell table.md and ladder.md print (cells.pair_cell
on summary.csv's columns): nothing is computed here that the tables do not show.

    On this machine (AMD EPYC, 2 cores, avx512_bf16; noise floor ±2.6 % over 3 self pairs):
    Ladder: small CNN, bf16 autocast (Fashion-MNIST, 90 measured steps of 128)
      train_amp.py cnn, bf16       × train.py                1.36× (1.27–1.36)  faster
      ...
      train.py → train_fast.py     whole ladder              1.48× (1.25–1.81)  faster
    ...
    Not measured: 1 skipped; why: table.md's status column, logs/
    Tables: results/local/cpu/table.md, ladder.md · plots: results/local/cpu/*.png · side by side: ...
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import pandas as pd
from cells import cell_text, cpu_kind, pair_cell, row_groups, sweep_groups
from pairs import NOISY_FLOOR

WIDTH = 100  # the widest line printed: an 80-column terminal wraps a few, a 100- or 120-column one none
_RATIO = re.compile(r"^\d+\.\d+× \([^)]*\)")  # "1.36× (1.27–1.36)", "1.37× (1 pair)": pair_cell's ratio and spread
_NOTE = " disturbed pair"  # pair_cell's "(N disturbed pair(s) left out)"
NAME_MIN = 28  # the columns a row's name keeps before a verdict's reason goes to a footnote


def end_of_run(summary: pd.DataFrame, env: dict, noise: dict | None, out: Path) -> str:
    """The end of a bench run (and of --tables-only) for the terminal, every line within WIDTH columns: the machine
    and the noise floor; each ladder (summary rows with `ladder`, as tables.ladder_markdown groups them) with one
    line per measured rung against its base (the table's "× its base" cell, split into ratio and verdict) and one
    for the whole ladder (the last rung's "× the first rung" cell); the other comparisons (rungs outside a ladder
    one line each, a memory table, sweep or set of ablations one line each with its verdicts counted); one line
    counting the rows that did not run and where to read why; and the folder's tables, plots and pages. A verdict
    whose pairs were partly left out as disturbed carries a "*" and a footnote (the count is in ladder.md)."""
    rungs, lines = [], [f"On this machine ({_machine(env)}; {_floor(noise)}):"]
    if len(lines[0]) > WIDTH:  # a long CPU name, a second floor: the floor on a line of its own
        lines = [f"On this machine ({_machine(env, WIDTH - 19)}):", _fit(f"  {_floor(noise)}", WIDTH)]
    ladders = row_groups(summary, "ladder")
    by_name = {r["config"]: r for r in summary.to_dict("records")}

    def script(name: str) -> str:  # a base row's script: "train.py" for "train.py cnn"
        return cell_text((by_name.get(name) or {}).get("script")) or name.split(" ")[0]

    for name, rows in ladders:
        records = rows.to_dict("records")
        measured = [r for r in records[1:] if r.get("status") == "ok"]
        tokens = any(pd.notna(r.get("tokens_per_sample")) and r.get("tokens_per_sample") for r in records)
        unit = "tokens/s" if tokens else "images/s"  # what each rung's × compares
        lines.append(_fit(f"Ladder ({unit} ×): {name}", WIDTH))
        for r in measured:
            lines.append(len(rungs))
            rungs.append((r["config"], "× " + script(cell_text(r.get("rung_base"))), pair_cell(r, "speedup_rung")))
            if pd.notna(r.get("x_target")) or cell_text(r.get("x_target_verdict")):  # run to a target: its time too
                lines.append(len(rungs))
                rungs.append(("  sooner to the target", rungs[-1][1], pair_cell(r, "x_target")))
        if len(measured) > 1 and records[-1] is measured[-1]:  # two links or more: the product down to the first rung
            lines.append(len(rungs))
            first, last = records[0], measured[-1]
            rungs.append((f"{first['script']} → {last['script']}", f"whole, {unit}", pair_cell(last, "speedup")))
    others = _other_comparisons(summary, script, rungs)
    if others:
        lines += ["Other comparisons (table.md):", *others]
    aligned, notes = _rung_lines(rungs)
    lines = [aligned[x] if isinstance(x, int) else x for x in lines] + notes
    folder = _shown(out)
    not_ok = Counter(s for s in summary.status.map(cell_text) if s != "ok")
    if not_ok:
        counts = ", ".join(f"{n} {status}" for status, n in not_ok.items())
        lines.append(_fit(f"Not measured: {counts}; why: table.md's status column, logs/", WIDTH))
    places = (
        f"{folder}/table.md" + (", ladder.md" if ladders else ""),
        f"{folder}/*.png",
        f"{folder}/index.html",
    )
    if not (Path(out) / "index.html").is_file():  # a folder to commit under results/: the bench left the pages out
        places = (*places[:2], "python bench/pages/diff_pages.py --out DIR")  # reads every folder of results/
    one = f"Tables: {places[0]} · plots: {places[1]} · side by side: {places[2]}"
    three = [f"Tables:       {places[0]}", f"Plots:        {places[1]}", f"Side by side: {places[2]}"]
    if len(one) <= WIDTH:
        lines.append(one)
    elif max(map(len, three)) <= WIDTH:
        lines += three
    else:  # a folder's path too long for a line with anything else: the path alone, then the names in it
        names = [place.replace(f"{folder}/", "") for place in places]
        lines += [f"In {folder}/:", f"  tables: {names[0]} · plots: {names[1]}", f"  side by side: {names[2]}"]
    return "\n".join(lines)


def _machine(env: dict, width: int = WIDTH) -> str:
    """The hardware line of table.md, short, the CPU's name cut to `width` in all: "AMD EPYC, 2 cores, avx512_bf16",
    "1 × NVIDIA H200"."""
    if env.get("gpu_count"):
        return _fit(f"{env['gpu_count']} × {' + '.join(sorted(set(env.get('gpus') or [])))}", width)
    flags = [f for f in env.get("cpu_flags") or [] if "bf16" in f or f.startswith("amx")]
    bf16 = (", ".join(flags) or "bf16 instructions") if env.get("bf16_instructions") else "no bf16 instructions"
    if env.get("isa_limits") and not env.get("bf16_native", True) and env.get("bf16_instructions"):
        bf16 = cpu_kind(env)  # "AVX512-BF16, limited to AVX2": what a CPU without them runs
    rest = f", {env.get('cpu_count')} cores, {bf16}"
    return _fit(str(env.get("cpu_model") or env.get("cpu")), max(width - len(rest), 12)) + rest


def _floor(noise: dict | None) -> str:
    """The noise floor as table.md's header states it (cells.noise_line), in a few words."""
    noise = noise or {}
    floor, n = noise.get("floor"), sum(len(ratios) for _, _, ratios in noise.get("self_pairs", []))
    if floor is None:
        return "noise floor not measured: no verdicts"
    text = f"noise floor ±{100 * floor:.1f} % over {n} self pairs"
    if floor > NOISY_FLOOR:
        text += f", wider than ±{100 * NOISY_FLOOR:.0f} %"
    if "target_floor" in noise:
        target = noise["target_floor"]
        text += "; time to target: " + (f"±{100 * target:.1f} %" if target is not None else "no floor")
    return text


def _split(cell: str) -> tuple[str, str, bool]:
    """A pair cell as (ratio, verdict, whether pairs were left out): "1.22× (1.14–1.23), faster (1 disturbed pair
    left out)" -> ("1.22× (1.14–1.23)", "faster", True); "disturbed" -> ("–", "disturbed", False)."""
    match = _RATIO.match(cell)
    if not match:
        return "–", "" if cell == "–" else cell, False
    verdict = cell[match.end() :].removeprefix(", ")
    left_out = _NOTE in verdict
    return match.group(), verdict.split(" (")[0] if left_out else verdict, left_out


def _rung_lines(rungs: list[tuple[str, str, str]]) -> tuple[list[str], list[str]]:
    """One aligned line per (row, "× base", pair cell), and the footnotes they need. The row's name is cut to what
    the widest ratio, base and verdict leave of WIDTH; a verdict with a reason that would leave the names fewer than
    NAME_MIN columns ("no verdict: 1 pair, 3 needed" beside a long base) reads "no verdict", its reasons in a
    footnote. The verdicts themselves are never cut."""
    cells = [(name, base, *_split(cell)) for name, base, cell in rungs]
    if not cells:
        return [], []
    base_w, ratio_w = (max(len(c[i]) for c in cells) for i in (1, 2))
    room = WIDTH - 8 - base_w - ratio_w - NAME_MIN  # for the verdict, its "*" included
    reasons = list(dict.fromkeys(c[3].split(": ", 1)[1] for c in cells if len(c[3]) + c[4] > room and ": " in c[3]))
    cells = [
        (n, b, r, v.split(": ")[0] if len(v) + left > room and ": " in v else v, left) for n, b, r, v, left in cells
    ]
    verdict_w = max(len(c[3]) + c[4] for c in cells)
    name_w = max(min(max(len(c[0]) for c in cells), WIDTH - 8 - base_w - ratio_w - verdict_w), 16)
    lines = [
        _fit(f"  {_fit(name, name_w):<{name_w}}  {base:<{base_w}}  {ratio:<{ratio_w}}  {verdict}{'*' * left}", WIDTH)
        for name, base, ratio, verdict, left in cells
    ]
    notes = [_fit("  no verdict: " + "; ".join(reasons), WIDTH)] if reasons else []
    if any(c[4] for c in cells):
        notes.append("  * some of its pairs ran disturbed and were left out (how many: table.md)")
    return lines, notes


def _other_comparisons(summary: pd.DataFrame, script, rungs: list) -> list:
    """The comparisons outside the ladders: a rung outside any ladder (an input pipeline over its base) as a rung's
    line (its index in `rungs`, which it joins); each memory table, sweep and set of ablations in one line, its rows'
    verdicts counted (self pairs left out: they are the noise floor)."""
    lines = []
    for r in summary.to_dict("records"):
        if cell_text(r.get("rung_base")) and not cell_text(r.get("ladder")) and r.get("status") == "ok":
            lines.append(len(rungs))
            rungs.append((r["config"], "× " + script(cell_text(r.get("rung_base"))), pair_cell(r, "speedup_rung")))
    groups = [
        (f"Memory: {n}", rows.iloc[1:], "x_memory", "comparison", {}) for n, rows in row_groups(summary, "memory")
    ]
    groups += [(f"Sweep: {n}", rows.iloc[1:], "x_sweep", "comparison", {}) for n, rows, _ in sweep_groups(summary)]
    ablations = summary[summary.ablation_of.map(cell_text) != ""]
    buys = {"slower": "pays", "faster": "costs"}  # × the whole without the change: slower, so the change pays
    for whole, rows in ablations.groupby("ablation_of", sort=False):
        groups.append((f"Ablations of {whole}", rows, "of_whole", "change", buys))
    for title, rows, column, noun, words in groups:
        verdicts = Counter(
            words.get(v, v.split(":")[0]) for v in (_split(pair_cell(r, column))[1] for r in rows.to_dict("records"))
        )
        verdicts.pop("", None)
        tail = f"{len(rows)} {noun}{'s' * (len(rows) != 1)}" + (
            ": " + ", ".join(f"{n} {v}" for v, n in verdicts.items()) if verdicts else ", none in pairs"
        )
        lines.append(_fit(f"  {_fit(title, WIDTH - 5 - len(tail))} · {tail}", WIDTH))
    return lines


def _fit(text: str, width: int) -> str:
    """`text` cut to `width` columns, an ellipsis at the cut: at the last word's end when one ends in the second
    half ("train_compile.py cnn…", not "train_compile.py cnn, floa…")."""
    if len(text) <= width:
        return text
    cut = text[: max(width - 1, 0)]
    word = len(cut) if text[len(cut)] in " ," else max(cut.rfind(" "), cut.rfind(","))
    return (cut[:word] if word > width // 2 else cut).rstrip(" ,") + "…"


def _shown(out: Path) -> str:
    """The folder as the user may type it: relative to the working directory when it lies under it."""
    path = Path(out).resolve()
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return os.fspath(out)

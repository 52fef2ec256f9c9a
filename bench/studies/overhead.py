"""Where a bench run's seconds go, folder against folder: per run, the median of its wall time and of its parts (the
training steps, the compile, the start-up before the training and what follows it), with each folder's noise floor
and its share of comparison cells that got a verdict. Reads each folder's runs.csv, pairs.csv and summary.csv.

    python bench/studies/overhead.py BEFORE AFTER                   # two result folders: the table, printed
    python bench/studies/overhead.py BEFORE AFTER --out AFTER/overhead.md   # and written there

The parts: `steps` = train_s - compile_s (every training step, warm-up included, less the first step's compile),
`compile` = compile_s (torch.compile's first step; per run, the median over the runs that compiled), `outside` = wall_s - train_s (everything the
run spends outside its training loop: the interpreter, imports, data, model, evaluation, the metrics, the exit), and
where the run recorded its training's wall-clock marks, `outside` cut into `start-up` (launch to the training's
start) and `after` (the training's end to the exit). The issue's `wall_s - train_s - compile_s` subtracts a compile
twice: train_s holds it already (it is the first step).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: pairs
import pairs  # noqa: E402

VERDICTS = ("faster", "slower", "no measurable difference")


def parts(folder: Path) -> pd.DataFrame:
    """Per run of `folder` that finished ok: wall, steps, compile, outside, start-up and after (seconds)."""
    runs = pd.read_csv(folder / "runs.csv")
    runs = runs[runs.status == "ok"].copy()
    compile_s = pd.to_numeric(runs.get("compile_s"), errors="coerce").fillna(0.0)
    out = pd.DataFrame({"config": runs.config, "wall": runs.wall_s, "steps": runs.train_s - compile_s,
                        "compile": compile_s, "outside": runs.wall_s - runs.train_s})  # fmt: skip
    for column, name in (("startup_s", "start-up"), ("after_s", "after")):
        out[name] = pd.to_numeric(runs[column], errors="coerce") if column in runs else float("nan")
    out["started"] = runs["started"] if "started" in runs else "fresh"
    return out


def verdicts(folder: Path) -> tuple[float | None, int, int]:
    """(noise floor, cells with a verdict, cells): the floor from the folder's undisturbed self pairs (pairs.csv, as
    the tables compute it), the cells every comparison column of summary.csv fills."""
    table = pd.read_csv(folder / "pairs.csv")
    self_pairs = table[(table.kind == "same_as") & table.ratio.notna() & table.disturbed.isna()]
    floor = pairs.noise_floor(list(self_pairs.ratio))
    summary = pd.read_csv(folder / "summary.csv")
    cells = [v for c in summary.columns if c.endswith("_verdict") and c != "speedup_verdict" for v in summary[c]
             if isinstance(v, str) and v]  # fmt: skip
    return floor, sum(v in VERDICTS for v in cells), len(cells)


def row(label: str, folder: Path) -> dict:
    p = parts(folder)
    floor, judged, cells = verdicts(folder)
    med = {k: statistics.median(p[k].dropna()) if p[k].notna().any() else None for k in
           ("wall", "steps", "outside", "start-up", "after")}  # fmt: skip
    compiled = p.compile[p.compile > 0]  # the compile's median over the runs that compiled
    med["compile"] = statistics.median(compiled) if len(compiled) else None
    return {
        "folder": label,
        "runs": len(p),
        "forked": int((p.started == "forked").sum()),
        "total_wall": p.wall.sum(),
        "total_steps": p.steps.sum(),
        "total_compile": p.compile.sum(),
        "total_outside": p.outside.sum(),
        **{f"median_{k}": v for k, v in med.items()},
        "floor": floor,
        "judged": judged,
        "cells": cells,
    }


def markdown(rows: list[dict]) -> str:
    def s(v):
        return "–" if v is None or v != v else f"{v:.2f}"

    lines = [
        "| folder | runs (forked) | per run: wall | steps | compile (the runs that compiled) | outside (start-up + after) | all runs: wall | "
        "steps | compile | outside | noise floor | cells with a verdict |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        floor = f"±{100 * r['floor']:.1f} %" if r["floor"] is not None else "–"
        share = f"{r['judged']} of {r['cells']}" + (f" ({100 * r['judged'] / r['cells']:.0f} %)" if r["cells"] else "")
        split = (f" ({s(r['median_start-up'])} + {s(r['median_after'])})"
                 if r["median_start-up"] is not None else "")  # fmt: skip
        lines.append(
            f"| `{r['folder']}` | {r['runs']} ({r['forked']}) | {s(r['median_wall'])} s | {s(r['median_steps'])} s | "
            f"{s(r['median_compile'])} s | {s(r['median_outside'])} s{split} | {r['total_wall']:.0f} s | "
            f"{r['total_steps']:.0f} s | {r['total_compile']:.0f} s | {r['total_outside']:.0f} s | {floor} | {share} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+", help="result folders with runs.csv, pairs.csv, summary.csv")
    parser.add_argument("--out", type=Path, default=None, help="also write the table (Markdown) here")
    args = parser.parse_args()
    try:
        rows = [row(str(f), f) for f in args.folders]
    except (OSError, KeyError, pd.errors.EmptyDataError) as error:
        print(f"overhead.py: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    text = markdown(rows)
    print(text)
    if args.out:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
        import common

        common.io.atomic_write_text(args.out, text + "\n")


if __name__ == "__main__":
    main()

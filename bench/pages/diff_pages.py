"""Side-by-side pages: each technique script next to its base, aligned, every `# new #` line highlighted.

    python bench/pages/diff_pages.py --out diffs                # then open diffs/index.html in a browser
    python bench/pages/diff_pages.py --out diffs --results results/cpu-2core-avx2-2026-11-26-b   # its speed-ups only

Static HTML with inline CSS: no server, no network, no JavaScript. index.html shows the chains of variants as a tree
(each variant under the base it declares) and lists every (variant, base) pair with its technique and every speed-up
and peak memory measured in the result folders (default: every folder under results/ with a summary.csv, newest
first; per folder, the largest model first); one page per variant shows base and variant side by side, and one page
per rung two or more down its chain (chain-<rung>.html, e.g. train.py -> train_fast.py) shows which rung introduced
each marked line, and the last rung's measured rows: over the chain's root, and rung by rung on the way.
Every number names its host (the GPUs, else the CPU, its cores and its kind: AVX512-BF16, AVX2 only, or limited to
AVX2), its folder and the folder's noise floor; a self pair (a row against a copy of itself) is that floor, never an
effect; and a folder whose floor is past ±15 % gives no ratio (bench/pages/pages.py's `allowed`, as on the Markdown
pages).
The module docstring is each script's own text (what it shows, its run lines): shown in blue, never compared. The
alignment is the marker checker's (bench/pages/check_markers.py: its parser and its minimal diff of logical lines), so
both see the same statements: unchanged statements face each other, changed ones sit in one row, and each line the
variant marks as new relative to its base carries its explanation in the right-hand column (markers inherited from
earlier rungs are shown as plain lines). bench.py writes these pages into its --out folder, unless that is a folder
to commit under results/ (results/local/ is not).
"""

from __future__ import annotations

import argparse
import html
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "bench" / "pages"), str(REPO / "bench"), str(REPO / "src")]  # check_markers, tables, common

from cells import cell_text, cpu_kind, pair_cell, rate_text  # noqa: E402
from check_markers import Parsed, compare, declared_base, opcodes, pairs, parse, title, tree  # noqa: E402
from pages import allowed, floor_of  # noqa: E402  the Markdown pages' rule: no ratio from a floor past ±15 %
from pairs import NOISY_FLOOR  # noqa: E402
from tables import compared_cell  # noqa: E402

import common  # noqa: E402

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em; color: #1f2328; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.5em; }
table { border-collapse: collapse; }
table.pairs td, table.pairs th { border: 1px solid #d0d7de; padding: 4px 8px; vertical-align: top; text-align: left; }
table.diff { width: 100%; table-layout: fixed; }
table.diff td { vertical-align: top; padding: 0; border-bottom: 1px solid #eaeef2; }
table.diff col.code { width: 40%; } table.diff col.why { width: 20%; }
table.diff th { text-align: left; padding: 4px 6px; background: #f6f8fa; border-bottom: 1px solid #d0d7de; }
pre { margin: 0; font: 12px/1.4 ui-monospace, monospace; white-space: pre-wrap; overflow-wrap: anywhere; }
.l { display: block; padding: 0 6px; } .n { color: #8c959f; display: inline-block; width: 3.5em; user-select: none; }
.new { background: #dafbe1; border-left: 3px solid #1a7f37; }
.old { background: #ffebe9; border-left: 3px solid #cf222e; }
.own { background: #ddf4ff; border-left: 3px solid #0969da; }
.why { font-size: 12px; color: #1a7f37; padding: 0 8px; }
.why div { padding: 1px 0; } .legend span { padding: 1px 6px; margin-right: 8px; }
.muted { color: #656d76; }
"""


@dataclass
class Segment:
    """The physical lines a statement owns: the comments and blank lines above it, then the statement itself."""

    first: int  # 1-based, inclusive
    last: int
    text: str  # the logical line (tokens joined by spaces); "" for the lines after the last statement


DOCSTRING = "<the module docstring>"


def segments(parsed: Parsed, n_lines: int) -> list[Segment]:
    """Cut a file into one Segment for the module docstring (with the lines above it), one per statement of
    `parsed`, plus one for any trailing lines."""
    out, start = [], 1
    if parsed.docstring:
        out.append(Segment(1, parsed.docstring[-1], DOCSTRING))
        start = parsed.docstring[-1] + 1
    for s in parsed.statements:
        out.append(Segment(start, s.end, s.text))
        start = s.end + 1
    if start <= n_lines:
        out.append(Segment(start, n_lines, ""))
    return out


def _code(
    lines: list[str], first: int, last: int, side: str, highlight: dict[int, str] | set[int], own: range = range(0)
) -> str:
    rows = []
    for n in range(first, last + 1):
        css = ("new" if side == "v" else "old") if n in highlight else "own" if n in own else ""
        rows.append(
            f'<span class="l {css}" id="{side}{n}"><span class="n">{n}</span>{html.escape(lines[n - 1])}</span>'
        )
    return "<pre>" + "".join(rows) + "</pre>"


def page(base: Path, variant: Path, measured: list[dict], chain: list[Path] | None = None) -> str:
    """The HTML page of one pair: a header with the technique and its measured rows, then the aligned table.

    With `chain` (the scripts from `base` down to `variant`, each the base of the next), the page shows a chain's
    last rung against its root: each marked line's explanation starts with the rung that introduced it."""
    base_lines, variant_lines = base.read_text().splitlines(), variant.read_text().splitlines()
    base_parsed, variant_parsed = parse(base), parse(variant)
    base_segs, variant_segs = segments(base_parsed, len(base_lines)), segments(variant_parsed, len(variant_lines))
    new = compare(base, variant).new_lines
    if chain:
        rung = introduced_by(chain)
        labelled = {}
        for n, why in sorted(new.items()):  # the rung once for each run of its lines, and before each explanation
            name = rung.get(n, "")  # "": a line of a changed statement that is the root's own (no rung to name)
            first = n - 1 not in new or rung.get(n - 1, "") != name
            labelled[n] = (f"{name}: {why}" if name else why) if why else name if first else ""
        new = labelled
    rows = []
    for tag, i1, i2, j1, j2 in opcodes([s.text for s in base_segs], [s.text for s in variant_segs]):
        if tag == "equal":  # one row per unchanged statement, facing its twin
            blocks = [([b], [v]) for b, v in zip(base_segs[i1:i2], variant_segs[j1:j2], strict=True)]
        else:  # one row for the whole change: what the base had, what the variant has
            blocks = [(base_segs[i1:i2], variant_segs[j1:j2])]
        for bsegs, vsegs in blocks:
            changed = set() if tag == "equal" else {n for s in bsegs for n in range(s.first, s.last + 1)}
            left = "".join(_code(base_lines, s.first, s.last, "b", changed) for s in bsegs)
            right = "".join(_code(variant_lines, s.first, s.last, "v", new, variant_parsed.docstring) for s in vsegs)
            notes = [new[n] for s in vsegs for n in range(s.first, s.last + 1) if new.get(n)]
            if any(s.text == DOCSTRING for s in vsegs):
                notes.insert(0, "the script's own docstring: what it shows and its run lines (never compared)")
            why = "".join(f"<div>{html.escape(text)}</div>" for text in dict.fromkeys(notes))  # each text once
            rows.append(f'<tr class="{tag}"><td>{left}</td><td>{right}</td><td class="why">{why}</td></tr>')
    heading = technique(variant)
    if chain:
        heading = (
            "The whole chain, " + " → ".join(c.name for c in chain) + ": every line a rung added, with the rung "
            "that introduced it before its explanation"
        )
    n_marked = len({n for n, why in new.items() if n in {s.line for s in variant_parsed.statements}})
    return _html(
        f"{variant.name} vs {base.name}",
        f'<p><a href="index.html">all techniques</a></p><h1>{html.escape(variant.name)} '
        f'<span class="muted">vs {html.escape(base.name)}</span></h1>'
        f"<p>{html.escape(heading)}</p>{measured_html(measured, chain)}"
        f'<p class="legend"><span class="new">added or changed, marked <code># new #</code></span>'
        f'<span class="old">in the base, replaced or removed</span> {n_marked} marked statements; '
        f"the right-hand column is the explanation after each marker. Same as "
        f"<code>diff src/{base.name} src/{variant.name}</code>, aligned on statements.</p>"
        '<table class="diff"><colgroup><col class="code"><col class="code"><col class="why"></colgroup>'
        f"<tr><th>{html.escape(base.name)}</th><th>{html.escape(variant.name)}</th><th>why</th></tr>"
        + "".join(rows)
        + "</table>",
    )


def chain_of(variant: Path) -> list[Path]:
    """The scripts from the root of `variant`'s chain down to `variant` (each the declared base of the next)."""
    chain = [variant]
    while (base := declared_base(chain[0])) and (chain[0].parent / base).is_file():
        chain.insert(0, chain[0].parent / base)
    return chain


def introduced_by(chain: list[Path]) -> dict[int, str]:
    """For each line of the chain's last script that some rung marked as new: the name of that rung.

    A line is traced up the chain: if the rung marks it as new relative to its base (`compare(...).new_lines`) that
    rung introduced it; otherwise it is followed to the base's line it is aligned with (the checker's minimal diff
    of `diff -w` lines), and so on up to the root."""
    *_, last = chain
    found = {}
    links = []  # per rung (last first): its new lines, and its lines' twins in its base
    for base, rung in reversed(list(zip(chain, chain[1:]))):
        comparison = compare(base, rung)
        links.append((rung.name, comparison.new_lines, comparison.aligned))
    for n in compare(chain[0], last).new_lines:
        at = n
        for name, new, twin in links:
            if at in new or at not in twin:
                found[n] = name
                break
            at = twin[at]
    return found


def technique(variant: Path) -> str:
    """What the variant teaches: its docstring's first line up to the colon (e.g. "Mixed precision (AMP)")."""
    return title(variant)


def measured_rows(results: list[Path]) -> dict[str, list[dict]]:
    """Per script name: its ok rows in the result folders' summary.csv that were compared with a reference in
    interleaved pairs, each with its folder, host (the GPUs, else the CPU's model, cores and kind: "AVX512-BF16",
    "AVX2 only", "AVX512-BF16, limited to AVX2"), the folder's noise floor, its comparison (median, spread, verdict as
    the floor allows it: bench/pages/pages.py's `allowed`, so a floor past ±15 % gives no ratio, as on the Markdown
    pages), the ratio over the profile's `baseline` row (`whole`, where the row has one), the rungs its comparison
    climbs (`ladder`: the row, its `rung_base`, that row's, ... each with its comparison) and the peak memory of its
    reference configuration (GiB), newest folder first. A self pair (a row `same_as` another: the row against a copy
    of itself) is no technique's effect: its spread is the folder's floor, which every row names."""
    found: dict[str, list[dict]] = {}
    folders = []
    for folder in results:
        summary, env = folder / "summary.csv", folder / "env.json"
        if summary.exists():
            started = json.loads(env.read_text()).get("started", "") if env.exists() else ""
            folders.append((started, folder, json.loads(env.read_text()) if env.exists() else {}))
    for _, folder, env in sorted(folders, key=lambda f: f[0], reverse=True):
        table = pd.read_csv(folder / "summary.csv")
        by_config = {r["config"]: r for r in table.to_dict("records")}
        floor = floor_of(folder)
        floor_text = f"noise floor ±{100 * floor:.1f} %" if floor is not None else "no noise floor measured"
        gpus = env.get("gpus") or []
        cpu = f"{env.get('cpu_model') or 'CPU'}, {env.get('cpu_count', '?')} cores ({cpu_kind(env)})"  # the host
        hardware = f"{len(gpus)} × {gpus[0]}" if gpus else cpu
        size = {"resnet50": 0, "resnet18": 1, "cnn": 2, "mlp": 3}
        for r in sorted(table.to_dict("records"), key=lambda r: size.get(r.get("model"), 4)):  # largest model first
            if r.get("status") != "ok" or cell_text(r.get("same_as")):  # a self pair: the floor, not an effect
                continue
            compared = compared_cell(r)
            if compared == "–":  # only what interleaved pairs measured against a reference
                continue
            reference = by_config.get(r.get("rung_base") or r.get("ablation_of"), {})
            baseline = cell_text(r.get("baseline"))
            whole = pair_cell(r, "speedup")
            found.setdefault(r["script"], []).append(
                {
                    "folder": folder.resolve().relative_to(REPO) if folder.resolve().is_relative_to(REPO) else folder,
                    "hardware": hardware,
                    "floor": floor_text,
                    "config": r["config"],
                    "images_per_s": r.get("images_per_s"),
                    "rate": rate_text(r),  # tokens/s for a language model
                    "compared": allowed(compared, floor),
                    "whole": allowed(f"{whole} over {baseline}", floor) if whole != "–" and baseline else "",
                    "baseline_script": cell_text(by_config.get(baseline, {}).get("script")),
                    "ladder": ladder(r, by_config, floor),
                    "mem": _memory(r),
                    "base_mem": _memory(reference),
                }
            )
    return found


def ladder(row: dict, by_config: dict[str, dict], floor: float | None) -> list[tuple[str, str]]:
    """The rungs a row's comparison climbs, root first: (script, comparison as the floor allows it) for the row, the
    row its `rung_base` names, that row's, and so on while a rung's base has a `rung_base` of its own."""
    steps, seen = [], set()
    while row and cell_text(row.get("rung_base")) and row["config"] not in seen:
        seen.add(row["config"])
        steps.insert(0, (row["script"], allowed(compared_cell(row), floor)))
        row = by_config.get(row["rung_base"], {})
    return steps


def _memory(row: dict) -> str:
    for key, label in (("peak_mem_allocated_gib", "peak allocated"), ("peak_host_rss_gib", "host RSS")):
        value = row.get(key)
        if value is not None and pd.notna(value):
            return f"{label} {float(value):.2f} GiB"
    return "–"


def _bold_ratio(cell: str) -> str:
    """A comparison's cell as HTML, its median ratio in bold ("no verdict (floor ±26 %) over x" has none)."""
    median, _, rest = cell.partition(" ")
    if median.endswith("×"):
        return f"<b>{html.escape(median)}</b> {html.escape(rest)}"
    return html.escape(cell)


def where(r: dict) -> str:
    """Where a row's numbers come from: its configuration, the host, the folder's floor and the folder."""
    return (
        f"<i>{html.escape(r['config'])}</i>, {html.escape(r['hardware'])}, {html.escape(r['floor'])}, "
        f"<code>{html.escape(str(r['folder']))}</code>"
    )


def measured_html(rows: list[dict], chain: list[Path] | None = None) -> str:
    """The page's measured rows, each with its host, floor and folder. With `chain` (a chain's page), a row of the
    last rung measured against a row of the root also shows that whole ratio and each rung's own on the way."""
    if not rows:
        return '<p class="muted">Not measured in the result folders given: run <code>bash run_all.sh</code>.</p>'
    items = []
    for r in rows:
        own = (
            f"{_bold_ratio(r['compared'])} ({html.escape(r['rate'])}; interleaved pairs: median, min–max, verdict), "
            f"{html.escape(r['mem'])} (its reference {html.escape(r['base_mem'])})"
        )
        if chain and r["whole"] and r["baseline_script"] == chain[0].name:  # the last rung over the chain's root
            own = (
                f"{_bold_ratio(r['whole'])}: {html.escape(chain[-1].name)} over {html.escape(chain[0].name)} "
                f"({html.escape(r['rate'])}; interleaved pairs: median, min–max, verdict)"
            )
            if len(r["ladder"]) > 1:  # the pairs climbed rung by rung: each rung over the one below it
                own += "; rung by rung: " + "; ".join(
                    f"{html.escape(script)} {_bold_ratio(cell)}" for script, cell in r["ladder"]
                )
        items.append(f"<li>{own}: {where(r)}</li>")
    return "<ul>" + "".join(items) + "</ul>"


def _html(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{CSS}</style></head><body>{body}</body></html>\n"
    )


def page_name(variant: Path) -> str:
    return f"diff-{variant.stem}.html"


def chain_page_name(variant: Path) -> str:
    return f"chain-{variant.stem}.html"


def write(out: Path, results: list[Path] | None = None, src: Path = REPO / "src") -> list[Path]:
    """Write index.html and one page per pair into `out` (atomically, each file); return the paths written."""
    if results is None:
        results = sorted(p.parent for p in (REPO / "results").glob("*/summary.csv"))
    measured = measured_rows(results)
    out.mkdir(parents=True, exist_ok=True)
    written, items = [], []
    for base, variant in pairs(src):
        rows = measured.get(variant.name, [])
        written.append(_write(out / page_name(variant), page(base, variant, rows)))
        effect = (
            "<br>".join(
                f"{html.escape(r['compared'])} ({where(r)}); {html.escape(r['mem'])} vs {html.escape(r['base_mem'])}"
                for r in rows
            )
            if rows
            else '<span class="muted">not measured</span>'
        )
        items.append(
            f'<tr><td><a href="{page_name(variant)}">{html.escape(variant.name)}</a></td>'
            f"<td>{html.escape(base.name)}</td><td>{html.escape(technique(variant))}</td><td>{effect}</td></tr>"
        )
    chains = []
    for _, variant in pairs(src):
        chain = chain_of(variant)
        if len(chain) >= 3:  # a rung two or more down from its root: train.py -> ... -> train_fast.py, the ladder
            rows = measured.get(variant.name, [])  # the last rung's rows: over its base, and over the root
            written.append(_write(out / chain_page_name(variant), page(chain[0], variant, rows, chain)))
            chains.append(
                f'<li><a href="{chain_page_name(variant)}">{html.escape(" → ".join(c.name for c in chain))}</a></li>'
            )
    index = _html(
        "Techniques side by side",
        "<h1>PyTorch training speed-ups, side by side</h1><p>Each page shows a technique script next to its base "
        "script, aligned statement by statement, with every line marked <code># new #</code> highlighted and its "
        "explanation beside it. Each variant names its base in its docstring's first line, so the scripts form "
        f"chains (each indented under its base):</p><pre>{html.escape(tree(src))}</pre>"
        "<p>Measured effect: every configuration of the technique in the result folders, newest folder first and the "
        "largest model first, as its rate over the configuration its table compares it with in interleaved pairs "
        "(median, min–max, verdict), each with its host, its folder's noise floor and the folder "
        f"({len(results)} folder(s) read). A row against a copy of itself is no effect: its spread is the folder's "
        f'noise floor. A folder whose floor is past ±{100 * NOISY_FLOOR:.0f} % gives no ratio, only "no verdict".</p>'
        '<table class="pairs"><tr><th>variant</th><th>base</th><th>technique</th><th>measured effect</th></tr>'
        + "".join(items)
        + "</table><h2>Whole chains</h2><p>A chain's last rung against its root: which rung introduced each line.</p>"
        + "<ul>"
        + "".join(chains)
        + "</ul>",
    )
    written.append(_write(out / "index.html", index))
    return written


def _write(path: Path, text: str) -> Path:
    common.io.atomic_write_text(path, text)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for index.html and the pages")
    parser.add_argument(
        "--results", type=Path, nargs="*", default=None, help="result folders with summary.csv (default: results/*)"
    )
    args = parser.parse_args()
    for folder in args.results or []:
        if not (folder / "summary.csv").is_file():
            parser.error(f"{folder} has no summary.csv (a folder written by bench/bench.py)")
    try:
        written = write(args.out, args.results)
    except OSError as error:
        parser.error(f"cannot write into --out {args.out}: {error}")
    print(f"diff_pages: {len(written) - 1} page(s) and {args.out / 'index.html'}")


if __name__ == "__main__":
    try:
        main()
    except common.io.WriteFailed as error:  # disk full, I/O error: the file named, its previous version left as it was
        print(f"diff_pages.py: error: {error}", file=sys.stderr)
        raise SystemExit(1) from None

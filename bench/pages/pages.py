"""The pages' generated blocks, each between two markers (the rest of a page is written by hand), so that no number
and no list that a script can read is typed:

- the "Measured now" block of each technique page (docs/techniques/<script>.md), written from the current folders
  that results/current.toml names: every row of the page's script in each folder's summary.csv, its rate and its
  comparison (× its base, the pairs' min–max, the verdict) and the folder's noise floor, as the folder's own tables
  give them. A page without the markers gets the block before its "## Same training" section (else "## Run", else at
  the end); the page says by hand which machine it speaks of;
- the README's "Every technique, measured" table, between the same markers: which row of which current folder each
  of its cells quotes is bench/pages/readme_table.toml's, the numbers are the folders';
- the README's first screen (the paragraphs under its Quick start, between FIRST_BEGIN and FIRST_END): its words are
  readme_table.toml's [first_screen] text, each {name} in it a cell of [first_screen.cells];
- the README's chain tree (between CHAINS_BEGIN and CHAINS_END): check_markers.tree() of the scripts' declarations;
- docs/scripts.md, whole: a row per script from its docstring (title, declared base, what it adds, first run line).

    python bench/pages/pages.py            # write every block and docs/scripts.md
    python bench/pages/pages.py --check    # exit 1 if one is not what this would write (tests/test_docs.py)

A verdict is printed as the folder's floor allows it now (bench/pairs.py): from a floor wider than NOISY_FLOOR no
ratio and no verdict reach a page, only "no verdict (floor ±N %)" (an older folder's summary may say otherwise).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import tomllib
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "bench" / "pages"), str(REPO / "bench"), str(REPO / "src")]  # results_index, cells, common

import check_markers  # noqa: E402
from cells import fmt, ips_cell, pair_cell, peak_cells, rate_text  # noqa: E402
from pairs import NOISY_FLOOR  # noqa: E402
from results_index import floor_pct, load_topics, machine  # noqa: E402

import common  # noqa: E402
from tables import compared_cell  # noqa: E402

BEGIN = "<!-- measured: written by bench/pages/pages.py from results/current.toml's folders; do not edit -->"
END = "<!-- /measured -->"
FIRST_BEGIN = (
    "<!-- first screen: written by bench/pages/pages.py from bench/pages/readme_table.toml and the folders; "
    "do not edit -->"
)
FIRST_END = "<!-- /first screen -->"
MORE_BEGIN = (
    "<!-- first screen, in detail: written by bench/pages/pages.py from bench/pages/readme_table.toml and the folders; "
    "do not edit -->"
)
MORE_END = "<!-- /first screen, in detail -->"
PAGES = REPO / "docs" / "techniques"
README = REPO / "README.md"
README_TABLE = REPO / "bench" / "pages" / "readme_table.toml"
CHAINS_BEGIN = "<!-- chains: written by bench/pages/pages.py from the scripts' docstrings; do not edit -->"
CHAINS_END = "<!-- /chains -->"
SCRIPTS_PAGE = REPO / "docs" / "scripts.md"
RATIO_COLUMNS = ("speedup_rung", "x_memory", "x_sweep", "of_whole")  # a row's own comparison, the first it has


def floor_of(folder: Path) -> float | None:
    """The folder's noise floor as a fraction (results_index.floor_pct), None where it was not measured."""
    pct = floor_pct(folder)
    return pct / 100 if pct is not None else None


def target_floor_of(folder: Path) -> float | None:
    """The noise floor of a folder's times to the target, as a fraction: its floors.json's `target_floor`
    (results_index.floors_of: written by the bench with its tables, by a study with its own), never its Markdown;
    None where it has none. Raises SystemExit with one line where floors.json is malformed, or missing beside a
    summary.csv."""
    from results_index import floors_of

    record = floors_of(folder)
    return record["target_floor"] if record and record.get("target_floor") is not None else None


def allowed(cell: str, floor: float | None) -> str:
    """The comparison's cell ("1.30× (1.25–1.33), faster over a") with what its folder's floor allows: no verdict
    without a floor; past a floor wider than NOISY_FLOOR no ratio either, "no verdict (floor ±N %) over a": a copy of
    one run strayed that far on that host, so its ratios are noise a reader would copy (the README once printed
    "3.80× (1.10–6.50)" from a ±52.6 % floor)."""
    if floor is None:
        return re.sub(r", (faster|slower|no measurable difference)", ", no verdict (no noise floor)", cell)
    ratio = re.match(r"[\d.]+× \([^)]*\), ", cell)
    if floor > NOISY_FLOOR and ratio:
        rest = cell[ratio.end() :]
        return f"no verdict (floor ±{100 * floor:.0f} %)" + (rest[rest.index(" over ") :] if " over " in rest else "")
    return cell


def rows_for(script: str, topics: list[dict]) -> list[str]:
    """The block's table rows: every ok row of `script` (not a copy of another row) in each current folder."""
    lines = []
    for topic in topics:
        folder = REPO / "results" / topic["folder"]
        try:
            summary = pd.read_csv(folder / "summary.csv")
        except (OSError, pd.errors.EmptyDataError):
            continue
        floor = floor_of(folder)
        floor_text = f"±{100 * floor:.1f} %" if floor is not None else "not measured"
        link = f"[`{topic['folder']}/`](../../results/{topic['folder']}/table.md)"
        for r in summary.to_dict("records"):
            if r.get("script") != script or r.get("status") != "ok" or pd.notna(r.get("same_as")):
                continue
            compared = allowed(compared_cell(r), floor)
            if pd.notna(r.get("x_target")) and pd.isna(r.get("x_self")):  # the same pairs' times to the target
                sooner = allowed(pair_cell(r, "x_target"), target_floor_of(folder))
                compared += f"; to the target in {fmt(r.get('time_to_target_s'), '.1f')} s{with_compile(r)}: {sooner}"
            lines.append(f"| {topic['name']} ({link}) | {r['config']} | {ips_cell(r)} | {compared} | {floor_text} |")
    return lines


def with_compile(r: dict) -> str:
    """ " (N s with its compile)" after a compiled run's training seconds to the target (`time_to_target_incl_compile_s`:
    what its user waited, the first step's compile included), "" for a run that compiled nothing."""
    if pd.isna(r.get("compile_s")) or pd.isna(r.get("time_to_target_incl_compile_s")):
        return ""
    return f" ({fmt(r['time_to_target_incl_compile_s'], '.1f')} s with its compile)"


def block(script: str, topics: list[dict]) -> str:
    rows = rows_for(script, topics)
    body = (
        [
            "| topic (folder) | configuration | images/s or tokens/s | compared | noise floor |",
            "|---|---|---|---|---|",
            *rows,
        ]
        if rows
        else [f"No current folder has a row of `{script}` yet ([results/README.md](../../results/README.md))."]
    )
    intro = (
        "Every row of this script in the folders that [results/README.md](../../results/README.md) names current, as "
        "their tables give it (rates: the median over the row's runs; compared: × its base in interleaved pairs, "
        "min–max, verdict)."
    )
    return "\n".join([BEGIN, "## Measured now", "", intro, "", *body, END])


def with_block(text: str, new: str) -> str:
    """`text` with its block replaced by `new`, or `new` inserted before "## Same training" / "## Run" / at the end."""
    if BEGIN in text and END in text:
        start, end = text.index(BEGIN), text.index(END) + len(END)
        return text[:start] + new + text[end:]
    for heading in ("\n## Same training", "\n## Run"):
        if heading in text:
            at = text.index(heading) + 1
            return text[:at] + new + "\n\n" + text[at:]
    return text.rstrip("\n") + "\n\n" + new + "\n"


class Folders:
    """The current folders' summaries, floors and environments, read once, by topic name."""

    def __init__(self, topics: list[dict]):
        self.by_topic = {t["name"]: t["folder"] for t in topics}
        self.summaries: dict[str, pd.DataFrame] = {}

    def folder(self, topic: str) -> str:
        if topic not in self.by_topic:
            raise SystemExit(f"pages.py: error: {README_TABLE.name} names topic {topic!r}, not in results/current.toml")
        return self.by_topic[topic]

    def row(self, topic: str, config: str) -> dict:
        """The summary.csv row `config` of the topic's current folder. Raises SystemExit (one line) when the folder
        has no such row, so that a re-run folder that renamed a configuration stops the writing, not the reader."""
        folder = self.folder(topic)
        if folder not in self.summaries:
            self.summaries[folder] = pd.read_csv(REPO / "results" / folder / "summary.csv")
        rows = self.summaries[folder]
        found = rows[(rows["config"] == config) & rows["same_as"].isna()]
        if found.empty:
            raise SystemExit(f"pages.py: error: results/{folder}/summary.csv has no row {config!r} ({topic})")
        return found.iloc[0].to_dict()

    def env(self, topic: str) -> dict:
        return json.loads((REPO / "results" / self.folder(topic) / "env.json").read_text())


def _against(cell: dict, folders: Folders, column: str) -> float | None:
    return folders.row(cell["topic"], cell["against"])[column] if "against" in cell else None


def cell_value(cell: dict, folders: Folders) -> str:
    """One cell's number, as readme_table.toml's `show` asks (its header lists them), from the folder's summary.csv:
    rates as the tables round them; ratios with their min–max and the verdict the folder's floor allows."""
    r, show = folders.row(cell["topic"], cell["config"]), cell["show"]
    if show == "rate":
        return rate_text(r)  # tokens/s for a language model, images/s for the others
    if show in ("ratio", "x_train", "sooner"):
        column = {"x_train": "speedup", "sooner": "x_target"}.get(show) or next(
            (c for c in RATIO_COLUMNS if pd.notna(r.get(c))), None
        )
        if column is None:
            raise SystemExit(f"pages.py: error: {cell['config']!r} ({cell['topic']}) was compared with nothing")
        floor = floor_of(REPO / "results" / folders.folder(cell["topic"]))
        if show == "sooner":  # the time to the target has a floor of its own (table.md's second noise line)
            floor = target_floor_of(REPO / "results" / folders.folder(cell["topic"]))
        text = allowed(pair_cell(r, column), floor)
        # "1.32× (1 pair), no verdict: 1 pair, 3 needed" says the count twice: once is enough in a table cell
        return re.sub(
            r" \((1 pair|[\d.]+–[\d.]+)\), no verdict: (\d+ pairs?), \d+ needed",
            lambda m: f" ({m[1]}, no verdict)" if m[1] == "1 pair" else f" ({m[1]}; {m[2]}, no verdict)",
            text,
        )
    if show == "peak":
        return peak_cells(r, folders.env(cell["topic"]))["of peak"]
    if show == "activations":
        base = _against(cell, folders, "activation_mib")
        return fmt(r["activation_mib"], ",.1f") + " MiB" + (f" against {fmt(base, ',.1f')}" if base else "")
    if show == "target_s":
        base = _against(cell, folders, "time_to_target_s")
        return fmt(r["time_to_target_s"], ".1f") + " s" + (f" against {fmt(base, '.1f')} s" if base else "")
    if show == "target_incl_compile_s":  # what its user waited: the first step's compile included
        return fmt(r["time_to_target_incl_compile_s"], ".1f") + " s"
    if show == "target_steps":
        return fmt(r["steps_to_target"], ",.0f")
    if show == "peak_memory":
        base = _against(cell, folders, "peak_mem_allocated_gib")
        return fmt(r["peak_mem_allocated_gib"], ".2f") + " GiB" + (f" against {fmt(base, '.2f')}" if base else "")
    if show == "params":
        base = _against(cell, folders, "params")
        mine = r["params_per_rank"] if pd.notna(r.get("params_per_rank")) else r["params"]
        return fmt(mine, ",.0f") + " parameters per process" + (f" against {fmt(base, ',.0f')}" if base else "")
    if show == "allreduce":
        base = _against(cell, folders, "allreduce_mib_per_step")
        return (
            fmt(r["allreduce_mib_per_step"], ".2f")
            + " MiB all-reduced a step"
            + (f" against {fmt(base, '.2f')}" if base else "")
        )
    if show == "pad":
        return "pad share " + fmt(r["pad_share"], ".1%")
    if show == "bubble":
        return f"idle {fmt(r['bubble_measured'], '.0%')} of a step (theory {fmt(r['bubble_theory'], '.0%')})"
    raise SystemExit(f"pages.py: error: {README_TABLE.name}: unknown show {show!r}")


def column_text(cells: list[dict], text: str, linked: set[str], folders: Folders) -> str:
    """A column's cell: its cells joined by "; ", each run of cells from a topic not yet in `linked` (the defaults,
    the row's earlier links; updated) followed by a link to its folder; then the words of `text`; "–" when neither."""
    parts, i = [], 0
    while i < len(cells):
        topic, run = cells[i]["topic"], []
        while i < len(cells) and cells[i]["topic"] == topic:
            label = cells[i]["label"]
            run.append((f"{label}: " if label else "") + cell_value(cells[i], folders))
            i += 1
        joined = "; ".join(run)
        if topic not in linked:
            linked.add(topic)
            folder = folders.folder(topic)
            joined += f" ([{topic}](results/{folder}/{'table.md' if (REPO / 'results' / folder / 'table.md').is_file() else 'README.md'}))"
        parts.append(joined)
    return "; ".join(parts + ([text] if text else [])) or "–"


def readme_table(spec: dict, folders: Folders) -> str:
    """The README's table and the paragraph above it naming the two default folders (machine, floor)."""
    heads = []
    for what, topic in (("CPU", spec["cpu_default"]), ("GPU", spec["gpu_default"])):
        folder = folders.folder(topic)
        floor = floor_pct(REPO / "results" / folder)
        floor_text = f"noise floor ±{floor:.1f} %" if floor is not None else "no noise floor yet: no verdicts"
        heads.append(
            f"**{what}**: {machine(folders.env(topic))}, [`{folder}/`](results/{folder}/table.md), {floor_text}"
        )
    lines = [
        "; ".join(heads) + "; other folders where a cell names them. × its base: the median of the interleaved pairs "
        "(min–max, or 1 pair); memory: what the script keeps for backward, or holds, per process.",
        "",
        "| technique (its page) | on the CPU | on one GPU | memory |",
        "|---|---|---|---|",
    ]
    for row in spec["row"]:
        name = f"[`{row['script']}`](docs/techniques/{row['script'][:-3]}.md): {row['adds']}"
        if "also" in row:
            name += f"; [`{row['also']}`](docs/techniques/{row['also'][:-3]}.md): {row['also_adds']}"
        linked = {spec["cpu_default"], spec["gpu_default"]}  # a topic's link once a row, none for the two defaults
        cpu = column_text(row.get("cpu", []), row.get("cpu_text", ""), linked, folders)
        gpu = column_text(row.get("gpu", []), row.get("gpu_text", ""), linked, folders)
        memory = column_text(row.get("memory", []), row.get("memory_text", ""), linked, folders)
        lines.append(f"| {name} | {cpu} | {gpu} | {memory} |")
    return "\n".join([BEGIN, *lines, END])


def first_screen_value(cell: dict, folders: Folders) -> str:
    """One {name} of the first screen: a table cell (cell_value; a time to the target's verdict in its own words,
    sooner / later), or, by `show`: "folder" (a link to the topic's folder), "machine" (what it ran on),
    "run_all_time" (the wall time that the folder's run_all-time.txt records, and how many runs its runs.csv holds),
    "nanogpt" (nanoGPT side by side: `run` against `against`, × sooner in its rounds: bench/studies/nanogpt.py's
    cell), "cold_start" (bench/studies/compile_cold_start.py's runs.csv: the median `column` of its `config` and
    `start`, in seconds)."""
    show = cell["show"]
    folder = REPO / "results" / folders.folder(cell["topic"])
    if show == "folder":
        page = "table.md" if (folder / "table.md").is_file() else "README.md"
        return f"[`{folder.name}/`](results/{folder.name}/{page})"
    if show == "machine":
        return machine(folders.env(cell["topic"]))
    if show == "run_all_time":
        try:
            wall = re.search(r"wall (\d+) min ([\d.]+) s", (folder / "run_all-time.txt").read_text())
            runs = len(pd.read_csv(folder / "runs.csv"))
        except (OSError, pd.errors.EmptyDataError) as error:
            raise SystemExit(f"pages.py: error: {folder.name}: {error}")
        if wall is None:
            raise SystemExit(f"pages.py: error: {folder.name}/run_all-time.txt has no 'wall M min S s' line")
        return f"{wall[1]} min {float(wall[2]):.0f} s ({runs} runs, re-runs of disturbed pairs included)"
    if show == "cold_start":
        try:
            runs = pd.read_csv(folder / "runs.csv")
        except (OSError, pd.errors.EmptyDataError) as error:
            raise SystemExit(f"pages.py: error: {folder.name}: {error}")
        mine = runs[(runs["config"] == cell["config"]) & (runs["start"] == cell["start"])][cell["column"]].dropna()
        if mine.empty:
            raise SystemExit(f"pages.py: error: {folder.name}/runs.csv has no {cell['column']} of {cell['config']}")
        return f"{mine.median():.1f} s"
    if show == "nanogpt":
        sys.path.insert(0, str(REPO / "bench" / "studies"))
        import nanogpt  # bench/studies/nanogpt.py: the side by side's own cells

        line = nanogpt.measured(folder)["cells"].get((cell["against"], cell["run"]))
        if line is None:
            raise SystemExit(f"pages.py: error: {folder.name} compares no {cell['run']} against {cell['against']}")
        return line[f"x sooner to {nanogpt.TARGET:.2f}"]
    text = cell_value(cell, folders)
    return text.replace(", faster", ", sooner").replace(", slower", ", later") if show == "sooner" else text


def first_screen(spec: dict, folders: Folders, key: str = "text") -> str:
    """The README's first screen between FIRST_BEGIN and FIRST_END: [first_screen]'s text with each {name} replaced
    by its cell; with key "more", its details (the section they link to) between MORE_BEGIN and MORE_END. Raises
    SystemExit (one line) on a name without a cell."""
    screen = spec.get("first_screen") or {}
    values = {name: first_screen_value(cell, folders) for name, cell in screen.get("cells", {}).items()}
    try:
        text = screen.get(key, "").strip().format(**values)
    except (KeyError, IndexError, ValueError) as error:
        raise SystemExit(f"pages.py: error: {README_TABLE.name} [first_screen] {key}: no cell for {error}")
    begin, end = (FIRST_BEGIN, FIRST_END) if key == "text" else (MORE_BEGIN, MORE_END)
    return "\n".join([begin, text, end])


def chains_block(src: Path = REPO / "src") -> str:
    """The README's chain tree between CHAINS_BEGIN and CHAINS_END: check_markers.tree() of the declarations."""
    return "\n".join([CHAINS_BEGIN, "```", check_markers.tree(src), "```", CHAINS_END])


def first_run_line(script: Path) -> str:
    """The first run line of a script's docstring that names the script (its indented lines, a trailing `\\`
    continuing one), as a code span with its comment: what --help prints first."""
    doc = ast.get_docstring(ast.parse(script.read_text()), clean=False) or ""
    pending = ""
    for line in doc.splitlines():
        if not (line.startswith("    ") or pending):
            continue
        pending += line.strip().removesuffix("\\").strip() + " "
        if line.rstrip().endswith("\\"):
            continue
        command, pending = " ".join(pending.split()), ""
        if f"src/{script.name}" in command and "|" not in command and "`" not in command:
            code, _, why = command.partition(" # ")
            return f"`{code}  # {why}`" if why else f"`{code}`"
    return "–"


def scripts_page(src: Path = REPO / "src") -> str:
    """docs/scripts.md: a row per script of `src`, in the chains' order, from its docstring: its page, title, the
    base it declares, what it adds and its first run line."""
    rows = []
    for name in check_markers.in_tree_order(src):
        script = src / name
        base = check_markers.declared_base(script)
        cells = [f"[`{name}`](techniques/{script.stem}.md)", check_markers.title(script), f"`{base}`" if base else "–"]
        rows.append("| " + " | ".join([*cells, check_markers.adds(script), first_run_line(script)]) + " |")
    return "\n".join(
        [
            "# The scripts",
            "",
            "<!-- written by bench/pages/pages.py from the docstrings of src/*.py; do not edit -->",
            "Every script of `src/`, in the order of [the chains](../README.md#the-chains-and-the-scripts): what it",
            "shows, the base it declares in its docstring's first line (`Title: base.py + what it adds`), what it adds,",
            "and the first run line of its docstring (`--help` prints them all). A new script gets its row from its",
            "docstring (`python bench/pages/pages.py`); how to add one: [CONTRIBUTING.md](../CONTRIBUTING.md).",
            "",
            "| script (its page) | what it shows | its base | what it adds | run it |",
            "|---|---|---|---|---|",
            *rows,
            "",
        ]
    )


def between(text: str, begin: str, end: str, new: str, where: str) -> str:
    """`text` with the block from `begin` to `end` replaced by `new`. Raises SystemExit (one line) without it."""
    if begin not in text or end not in text:
        raise SystemExit(f"pages.py: error: {where} has no {begin} ... {end}")
    start, stop = text.index(begin), text.index(end) + len(end)
    return text[:start] + new + text[stop:]


def load_readme_spec() -> dict:
    try:
        return tomllib.loads(README_TABLE.read_text())
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise SystemExit(f"pages.py: error: {README_TABLE}: {error}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description="write the generated blocks: each technique page's Measured now, the README's first screen, table "
        "and chain tree, and docs/scripts.md"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if a page's block is stale")
    args = parser.parse_args()
    topics = load_topics()
    stale = []

    def keep(path: Path, old: str, new: str) -> None:
        if new != old:
            stale.append(path.relative_to(REPO))
            if not args.check:
                common.io.atomic_write_text(path, new)  # Ctrl-C leaves the page whole, old or new

    for page in sorted(PAGES.glob("*.md")):
        script = page.stem + ".py"
        if not (REPO / "src" / script).is_file():
            continue  # a page of no script (cpu_launch.md)
        text = page.read_text()
        keep(page, text, with_block(text, block(script, topics)))
    readme = README.read_text()
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"pages.py: error: README.md has no {BEGIN} ... {END} for its table")
    spec, folders = load_readme_spec(), Folders(topics)
    new = with_block(readme, readme_table(spec, folders))
    new = between(new, FIRST_BEGIN, FIRST_END, first_screen(spec, folders), "README.md (its first screen)")
    new = between(
        new, MORE_BEGIN, MORE_END, first_screen(spec, folders, "more"), "README.md (the first screen's details)"
    )
    new = between(new, CHAINS_BEGIN, CHAINS_END, chains_block(), "README.md (its chain tree)")
    keep(README, readme, new)
    keep(SCRIPTS_PAGE, SCRIPTS_PAGE.read_text() if SCRIPTS_PAGE.is_file() else "", scripts_page())
    if args.check and stale:
        print(f"pages.py: stale blocks in {', '.join(map(str, stale))}: run python bench/pages/pages.py",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(1)
    if not args.check:
        print(f"pages.py: wrote {len(stale)} page(s)")


if __name__ == "__main__":
    main()

"""results/README.md, the index of the committed results: for each topic of results/current.toml its current folder,
then every other folder with the pages that still cite it, then the mutation tables and the archive. Each line's
machine, date, commit, noise floor, runs' time, verdicts and headline are read from the folder (env.json or
provenance.json, floors.json, runs.csv) the way its pages read it, never typed, and never from its Markdown.

    python bench/pages/results_index.py            # write results/README.md
    python bench/pages/results_index.py --check    # exit 1 if results/README.md is not what this would write
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "src")]
from cells import cpu_kind  # noqa: E402

RESULTS = REPO / "results"
PAGES = ["README.md", "docs/*.md", "docs/techniques/*.md"]
MAIN_FILES = ("table.md", "README.md", "overhead.md", "cost.json")  # what a folder's link opens, the first it has
HEADER = """# Results

Written by `python bench/pages/results_index.py` from [`current.toml`](current.toml) (which folder stands for each
topic) and the folders themselves; do not edit. Every folder holds the logs, metrics and `env.json` of the runs its
numbers come from. *Scripts' commit*: the commit its tables' provenance line names (`provenance.json`'s correction
where a folder has one, else `env.json`'s), "(dirty)" where that tree had uncommitted changes; `git diff --stat COMMIT
-- src/` shows what changed since. *Floor*: the noise floor, the largest spread of a row against a copy of itself,
from the folder's `floors.json` (the bench writes it beside `summary.csv`, a study beside its table; `python
bench/bench.py --floors-only --out FOLDER` for a folder made before it); a comparison inside it is "no measurable
difference". *Runs' time*: the wall seconds of the folder's runs summed (`runs.csv`; the bench's own seconds and the
set-up left out), and "stopped after N of M pairs" where the runs ended before the plan did (`floors.json`: the fewest
pairs a comparison ran, of the rounds asked). *Verdicts*: its comparisons (each row against its base, from its
`floors.json`) by verdict as its floor allows them: faster, slower, within the floor, disturbed, or no verdict (too
few pairs; no floor measured; any verdict from a floor wider than ±{noisy:.0f} %); times to a target, and a
study's other measures, apart. *Headline*: its largest effect, the comparison farthest from 1.00× (either way) whose
verdict is faster or slower as the technique pages print it (no ratio at all from a floor wider than ±{noisy:.0f} %),
with the pairs' min–max. Your own runs go to `results/local/` (not committed).
"""


def load_topics() -> list[dict]:
    """results/current.toml's topics, each with name, folder and what. Raises SystemExit with one line when the file
    is missing, is not TOML, or a topic lacks one of them."""
    path = RESULTS / "current.toml"
    try:
        topics = tomllib.loads(path.read_text())["topic"]
        for topic in topics:
            if not isinstance(topic, dict):
                raise TypeError(f"a topic that is not a table: {topic!r}")
            missing = [key for key in ("name", "folder", "what") if key not in topic]
            if missing:
                raise KeyError(f"a topic without {', '.join(missing)}")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, KeyError, TypeError) as error:
        raise SystemExit(
            f"{Path(sys.argv[0]).name}: error: {path}: {error!r} (want [[topic]] tables of name, folder, what)"
        )
    return topics


def floors_of(folder: Path) -> dict | None:
    """A result folder's floors.json (bench/pairs.py floors_record: its noise floors and each comparison's ratio,
    spread and verdict, written by the bench with its tables or by a study), None where the folder has none (no
    comparison was made there: a probe, a sweep). Raises SystemExit with one line where the file is malformed, or
    where the folder has a summary.csv (the bench wrote it) but no floors.json (`bench.py --floors-only` writes it)."""
    from floors import FLOORS, read_floors

    try:
        record = read_floors(folder)
    except ValueError as error:
        raise SystemExit(f"{Path(sys.argv[0]).name}: error: {error}") from None
    if record is None and (folder / "summary.csv").is_file():
        raise SystemExit(f"{Path(sys.argv[0]).name}: error: {folder}/summary.csv has no {FLOORS} beside it: "
                         f"python bench/bench.py --floors-only --out {folder}")  # fmt: skip
    return record


def floor_pct(folder: Path) -> float | None:
    """A result folder's noise floor of its rates in percent, from its floors.json (`floors_of`: written by the bench
    beside summary.csv, or by a study such as bench/studies/nanogpt.py); None where it was not measured or the folder
    has no floors.json. Raises SystemExit (one line) as `floors_of` does."""
    record = floors_of(folder)
    return 100 * record["floor"] if record and record["floor"] is not None else None


def tracked_folders() -> set[str] | None:
    """The folders at the top of results/ that git tracks a file in; None where git cannot say (no git, or results/
    outside a repository: a copy of the files)."""
    try:
        proc = subprocess.run(["git", "ls-files", "-z", "--", "."], cwd=RESULTS, capture_output=True, text=True,
                              timeout=60, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode:
        return None
    return {path.split("/")[0] for path in proc.stdout.split("\0") if "/" in path}


def result_folders() -> list[str]:
    """The repository's folders at the top of results/ (sorted): those git tracks a file in, and those current.toml
    names, so that a new topic's folder joins the index before its first `git add`. A folder of a user's own runs that
    git does not track (`python bench/bench.py --out results/mine`) is theirs, not the repository's: it is not listed,
    and the index stays current beside it. Where git cannot say, every folder on disk. Never archive/ and mutations/
    (listed apart), local/ (the bench's default output, ignored by git) or hidden ones."""
    names = {p.name for p in RESULTS.iterdir() if p.is_dir() and not p.name.startswith(".")}
    tracked = tracked_folders()
    if tracked is not None:
        try:
            named = {t["folder"] for t in tomllib.loads((RESULTS / "current.toml").read_text()).get("topic", [])}
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, TypeError, KeyError):
            named = set()  # render()'s load_topics says what is wrong with it, in one line
        names &= tracked | named
    return sorted(names - {"archive", "mutations", "local"})


def main_file(folder: Path) -> str | None:
    return next((name for name in MAIN_FILES if (folder / name).is_file()), None)


def machine(env: dict) -> str:
    """The hardware a folder ran on, from its env.json: the GPUs, else the CPU with its bf16 instructions."""
    if env.get("gpus"):
        gpus = env["gpus"]
        return f"{len(gpus)} × {gpus[0]}"
    if "cpu_flags" not in env:
        return "– (its README says)"
    return f"{env.get('cpu_count', '?')} cores, {env.get('cpu_model') or 'a CPU'} ({cpu_kind(env)})"


def date_of(folder: Path, env: dict) -> str:
    found = re.search(r"20\d\d-\d\d-\d\d", folder.name)
    return found.group(0) if found else (env.get("started") or "?")[:10]


def floor_of(folder: Path) -> str:
    pct = floor_pct(folder)
    return f"±{pct:.1f} %" if pct is not None else "not measured"


def verdict_word(verdict: str) -> str:
    """A summary cell's verdict as the index counts it: its first word(s), anything else "no verdict"."""
    return next((w for w in ("faster", "slower", "no measurable difference", "disturbed") if verdict.startswith(w)),
                "no verdict")  # fmt: skip


def target_floor_pct(folder: Path) -> float | None:
    """The noise floor of a folder's times to a target, in percent, from its floors.json's `target_floor`
    (`floors_of`); None where it has none. Raises SystemExit (one line) as `floors_of` does."""
    record = floors_of(folder)
    return 100 * record["target_floor"] if record and record.get("target_floor") is not None else None


def judged(word: str, floor_pct_: float | None) -> str:
    """A verdict as the folder's floor allows it now, as the technique pages print it (bench/pages/pages.py `allowed`):
    without a measured floor no verdict at all; past a floor wider than bench/pairs.py's NOISY_FLOOR no verdict
    either, faster and slower included (the pages print no ratio there: `allowed`). "disturbed" and "no verdict"
    stay as they are."""
    from pairs import NOISY_FLOOR

    if word in ("faster", "slower", "no measurable difference") and floor_pct_ is None:
        return "no verdict"
    if word in ("faster", "slower", "no measurable difference") and floor_pct_ / 100 > NOISY_FLOOR:
        return "no verdict"
    return word


NOT_OWN = ("same_as", "first_rung", "first_point")  # floors.json's kinds that are no comparison of their own
MEASURE_WORDS = {  # floors.json's measures: (above 1, below 1, what), as the headline and the verdicts name them
    "rate": ("faster", "slower", ""),
    "time_to_target": ("sooner", "later", " to the target"),
    "time_to_target_incl_compile": ("sooner", "later", " to the target, compile included"),
    "launch_to_first_step": ("sooner", "later", " to the first step"),
    "first_step": ("shorter", "longer", " first step"),
}


def own_comparisons(record: dict | None) -> list[dict]:
    """A floors.json's comparisons of their own: each row against its base (a rung's, an ablation's whole, a ceiling,
    a memory table's first row, a sweep's previous point, a study's reference) once per measure; the self pairs and
    the products along a ladder or sweep are not comparisons of their own."""
    return [c for c in (record or {}).get("comparisons", []) if c["kind"] not in NOT_OWN]


def verdicts_of(folder: Path) -> str:
    """The folder's comparisons by verdict, from its floors.json (`own_comparisons`), each as the floor it was judged
    against allows it (`judged`; a time to a target against its own floor): a folder without a floor counts none,
    whatever its summary says (older folders said otherwise). The rates' counts first, then each other measure's
    ("; to the target: ..."). "–" without a floors.json, "no comparison" with one that holds none."""
    record = floors_of(folder)
    if record is None:
        return "–"
    counts: dict[str, dict[str, int]] = {}
    for c in own_comparisons(record):
        floor = 100 * c["floor"] if c.get("floor") is not None else None
        word = judged(verdict_word(c["verdict"]), floor)
        mine = counts.setdefault(c["measure"], {})
        mine[word] = mine.get(word, 0) + 1
    order = ("faster", "slower", "no measurable difference", "disturbed", "no verdict")
    parts = []
    for measure, found in sorted(counts.items(), key=lambda item: item[0] != "rate"):  # the rates first
        text = ", ".join(f"{found[w]} {w}" for w in order if w in found)
        words = MEASURE_WORDS.get(measure, ("", "", f" ({measure.replace('_', ' ')})"))[2]
        parts.append(f"{words.strip()}: {text}" if measure != "rate" else text)
    return "; ".join(parts) or "no comparison"


def headline_of(folder: Path) -> str:
    """The folder's largest effect, from its floors.json: of its own comparisons (`own_comparisons`) whose verdict
    is faster or slower as the technique pages print it (bench/pages/pages.py `allowed`: none without a floor, and
    no ratio at all past a floor wider than NOISY_FLOOR), the one whose ratio lies farthest from 1.00× either way
    (|log ratio|), as "ROW against REFERENCE: R× faster (LO–HI)" (sooner / later for a time to a target). Else why
    there is none: "none beyond its floor" (each within it), "no verdict (fewer than 3 undisturbed pairs)", "no
    verdict (floor ±N %)", "no verdict (no noise floor)"; "–" without comparisons."""
    import math

    from pairs import NOISY_FLOOR

    mine = own_comparisons(floors_of(folder))
    if not mine:
        return "–"
    allowed = [c for c in mine if c.get("floor") is not None and c["floor"] <= NOISY_FLOOR]
    beyond = [c for c in allowed if verdict_word(c["verdict"]) in ("faster", "slower") and c.get("ratio")]
    if beyond:
        best = max(beyond, key=lambda c: abs(math.log(c["ratio"])))
        above, below, what = MEASURE_WORDS.get(best["measure"], ("faster", "slower", f" ({best['measure']})"))
        word = above if verdict_word(best["verdict"]) == "faster" else below
        spread = f" ({best['lo']:.2f}–{best['hi']:.2f})" if best.get("lo") is not None and best.get("hi") else ""
        return f"{best['row']} against {best['reference']}: {best['ratio']:.2f}× {word}{what}{spread}"
    if any(judged(verdict_word(c["verdict"]), 100 * c["floor"]) == "no measurable difference" for c in allowed):
        return "none beyond its floor"
    if allowed:
        return "no verdict (fewer than 3 undisturbed pairs)"
    noisy = [c["floor"] for c in mine if c.get("floor") is not None]
    return f"no verdict (floor ±{100 * min(noisy):.0f} %)" if noisy else "no verdict (no noise floor)"


def runs_time(folder: Path) -> str:
    """How long the folder's runs took: their wall seconds summed from its runs.csv (the bench's own seconds and the
    set-up left out), "–" without one; then "stopped after N of M pairs" where its floors.json says the runs ended
    before the plan did (`pairs_run`, the fewest pairs a comparison ran, below `pairs_asked`, the rounds asked)."""
    import pandas as pd

    record = floors_of(folder) or {}
    asked, ran = record.get("pairs_asked"), record.get("pairs_run")
    stop = f"stopped after {ran} of {asked} pairs" if asked is not None and ran is not None and ran < asked else ""
    try:
        seconds = pd.to_numeric(pd.read_csv(folder / "runs.csv")["wall_s"], errors="coerce").sum()
    except (OSError, KeyError, pd.errors.EmptyDataError, pd.errors.ParserError):
        return stop or "–"
    minutes, rest = divmod(round(seconds), 60)
    spent = f"{minutes} min {rest} s" if minutes else f"{rest} s"
    return f"{spent}; {stop}" if stop else spent


def citing_pages(name: str) -> list[str]:
    pages = [p for pattern in PAGES for p in sorted(REPO.glob(pattern))]
    return [str(p.relative_to(REPO)) for p in pages if f"results/{name}/" in p.read_text()]


def commit_of(folder: Path, env: dict) -> str:
    """The commit of the scripts that made the folder, as its tables' provenance line reads it (bench/cells.py
    `folder_commit`: provenance.json's correction first, else env.json's), "(dirty)" after it where the tree had
    uncommitted changes; "?" where none is recorded."""
    from cells import folder_commit  # bench/cells.py imports peak, which imports common (src/, on the path above)

    try:
        commit, dirty, _ = folder_commit(folder, env)
    except (OSError, ValueError, AttributeError) as error:  # a provenance.json that is not a JSON object
        raise SystemExit(f"results_index.py: error: {folder.name}/provenance.json: {error}")
    return (commit or "?")[:10] + (" (dirty)" if commit and dirty else "")


def row(name: str, topic: dict | None) -> str:
    """The index's line for one folder: its link, machine, date, scripts' commit, noise floor (its floors.json's),
    how long its runs took (and where they stopped early), its verdicts, its headline, and the topic's `what` or the
    pages citing it."""
    folder = RESULTS / name
    env = {}
    for record in ("env.json", "provenance.json"):  # provenance.json: tables of other folders' runs
        try:
            env = json.loads((folder / record).read_text())
            break
        except (OSError, ValueError):
            continue
    if "commit" in env and "git" not in env:
        env = {"git": {"commit": env["commit"], "dirty": env.get("dirty")}}
    opens = main_file(folder)
    link = f"[`{name}/`]({name}/{opens})" if opens else f"`{name}/` (no table.md, README.md or summary file)"
    floor = floor_of(folder)
    if floor == "not measured" and not (folder / "table.md").is_file():
        floor = "no table (a probe)"
    cells = [link, machine(env), date_of(folder, env), commit_of(folder, env), floor, runs_time(folder),
             verdicts_of(folder), headline_of(folder)]  # fmt: skip
    if topic is not None:
        cells = [topic["name"], *cells, topic["what"]]
    else:
        cited = citing_pages(name)
        cells.append(", ".join(f"`{p}`" for p in cited) if cited else "no page")
    return "| " + " | ".join(cells) + " |"


def mutation_rows() -> list[str]:
    rows = []
    for folder in sorted((RESULTS / "mutations").iterdir()) if (RESULTS / "mutations").is_dir() else []:
        table = folder / "table.md"
        if not table.is_file():
            continue
        found = re.search(r"Mutation table: (\d+) of (\d+) bugs caught", table.read_text())
        caught = f"{found.group(1)} of {found.group(2)} caught" if found else "?"
        rows.append(f"| [`mutations/{folder.name}/`](mutations/{folder.name}/table.md) | {caught} |")
    return rows


def render() -> str:
    """The text of results/README.md. Raises SystemExit with one line if current.toml names a folder that is not in
    results/, or names one twice."""
    topics = load_topics()
    folders = result_folders()
    named = [t["folder"] for t in topics]
    unknown = [n for n in named if n not in folders]
    if unknown or len(set(named)) != len(named):
        raise SystemExit(f"results_index.py: error: current.toml names {unknown or 'a folder twice'}: "
                         "each topic one folder of results/")  # fmt: skip
    from pairs import NOISY_FLOOR

    lines = [HEADER.format(noisy=100 * NOISY_FLOOR), "## Current: the folder each page should quote", ""]
    if topics:
        head = "| topic | folder | machine | date | scripts' commit | floor | runs' time | verdicts | headline | what |"
        lines += [head, "|---|---|---|---|---|---|---|---|---|---|", *[row(t["folder"], t) for t in topics]]
    else:
        lines += ["None: results/current.toml names no topic yet."]
    others = [n for n in folders if n not in named]
    lines += ["", "## Older folders", ""]
    if others:
        lines += ["Superseded by a current folder, kept while a page still cites them (then archived).", "",
                  "| folder | machine | date | scripts' commit | floor | runs' time | verdicts | headline | cited by |",
                  "|---|---|---|---|---|---|---|---|---|", *[row(n, None) for n in others]]  # fmt: skip
    else:
        lines += ["None: each folder here is the current one of its topic; superseded ones are in archive/."]
    mutations = mutation_rows()
    lines += ["", "## Mutation tables", ""]
    if mutations:
        lines += ["Each lesson's realistic bugs and the test that must catch each (`python tests/mutations.py`).", "",
                  "| table | bugs caught |", "|---|---|", *mutations]  # fmt: skip
    else:
        lines += ["None yet: `python tests/mutations.py` writes one under results/mutations/."]
    lines += ["", "Archived folders, kept for their logs: [`archive/`](archive/README.md).", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description="write results/README.md, the index of the committed results")
    parser.add_argument("--check", action="store_true", help="exit 1 if results/README.md is stale")
    args = parser.parse_args()
    text = render()
    path = RESULTS / "README.md"
    if args.check:
        if not path.is_file() or path.read_text() != text:
            print("results_index.py: results/README.md is stale: run python bench/pages/results_index.py",
                  file=sys.stderr)  # fmt: skip
            raise SystemExit(1)
        return
    sys.path.insert(0, str(REPO / "src"))
    import common

    common.io.atomic_write_text(path, text)
    print(f"results_index.py: wrote {path.relative_to(REPO)}")


if __name__ == "__main__":
    main()

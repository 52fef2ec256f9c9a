"""The README and docs/ say what the code does: every run line parses with its script's own parser, every relative
link resolves, and the README stays short. The pages quote only result folders of the current scripts (never
results/archive/), each ratio and rate as the folder named beside it holds it, and name only tests that exist.

Run lines are read from README.md, CONTRIBUTING.md, every page under docs/ and bench/'s READMEs (inside ``` blocks,
one command a line, `\\` continuing it, and inside `code spans`) and every script's docstring (its indented run
lines, which --help also prints): each `python <script>.py ...`, `torchrun <its flags> <script>.py ...` and
`bash run_all.sh ...` (whose flags go to bench/bench.py). tests/runline_probe.py runs each script until its parser
has parsed the line, so an unknown flag or a value outside a flag's choices fails here as it would for a reader who
copies the line.
"""

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md")),
         *sorted((REPO / "bench").rglob("README.md"))]  # fmt: skip
SCRIPTS = sorted((REPO / "src").glob("*.py")) + sorted((REPO / "bench").rglob("*.py"))  # bench/ and its folders


def joined(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """(first line number, command) of shell lines, a trailing `\\` continuing a command on the next line."""
    found, pending, start = [], "", 0
    for n, line in lines:
        start = start if pending else n
        pending += line.strip().removesuffix("\\") + " "
        if not line.rstrip().endswith("\\"):
            found.append((start, pending.strip()))
            pending = ""
    return found


def commands(text: str) -> list[tuple[int, str]]:
    """(line number, command) for each shell command in a Markdown text: ``` block lines and `code spans`."""
    found, block, in_block = [], False, []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            block = not block
            continue
        if block:
            in_block.append((n, line))
        else:
            found.extend((n, span) for span in re.findall(r"`([^`]+)`", line))
    return joined(in_block) + found


def docstring_commands(script: Path) -> list[tuple[int, str]]:
    """The indented run lines of a script's docstring (the ones its --help prints), a trailing `\\` continuing one."""
    doc = ast.get_docstring(ast.parse(script.read_text()), clean=False) or ""
    lines = list(enumerate(doc.splitlines(), start=1))
    indented = [
        (n, line)
        for k, (n, line) in enumerate(lines)
        if line.startswith("    ") or (k and lines[k - 1][1].rstrip().endswith("\\"))
    ]
    return joined(indented)


def run_lines(command: str) -> list[tuple[str, list[str]]]:
    """(script, its args) of each command in a shell line (split at `&&`, `;`, `|`) that runs one of the project's
    Python scripts."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    try:
        words = list(lexer)
    except ValueError:
        return []
    found, part = [], []
    for word in [*words, ";"]:
        if word not in ("&&", ";", "||", "|", "&"):
            part.append(word)
            continue
        if part[:2] == ["bash", "run_all.sh"]:
            found.append(("bench/bench.py", part[2:]))
        for i, head in enumerate(part):
            if head in ("python", "python3", "torchrun"):
                rest = part[i + 1 :]
                at = next((k for k, w in enumerate(rest) if w.endswith(".py")), None)
                if at is not None and (head == "torchrun" or at == 0):  # not python -m / -c
                    script = rest[at]
                    if script.startswith(("src/", "bench/")) and (REPO / script).is_file():
                        found.append((script, rest[at + 1 :]))
                break
        part = []
    return found


def all_commands() -> list[tuple[str, str]]:
    """(where, command) of every shell command in the README, docs/ and the docstrings of src/ and bench/."""
    found = [(f"{page.relative_to(REPO)}:{n}", command) for page in PAGES for n, command in commands(page.read_text())]
    for script in SCRIPTS:
        found += [(f"{script.relative_to(REPO)}:{n} (docstring)", command) for n, command in docstring_commands(script)]
    return found


def all_run_lines() -> list[list]:
    return [[where, *found] for where, command in all_commands() for found in run_lines(command)]


def test_every_run_line_in_the_readme_docs_and_docstrings_parses(tmp_path):
    lines = all_run_lines()
    where = {entry[0].split(":")[0] for entry in lines}
    # The reader's first commands are there: the README's, and at least one in each technique page and docstring.
    assert "README.md" in where and any(w.startswith("docs/techniques/") for w in where), sorted(where)
    assert all(f"src/{s.name}" in where for s in (REPO / "src").glob("*.py")), sorted(where)
    todo = tmp_path / "lines.json"
    todo.write_text(json.dumps(lines))
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "runline_probe.py"), str(todo)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"{len(lines)} run lines, failing:\n{proc.stdout}{proc.stderr[-2000:]}"


def test_no_torchrun_line_asks_for_gpus_on_a_machine_without_cuda():
    """`torchrun --nproc-per-node gpu` stops with "Cuda is not available" on a CPU-only machine, although every script
    runs on one: the lines say `auto` (one process per GPU, or per CPU core where there is none) or a number. Checked
    on every machine without CUDA; the check itself is shown to fail on such a line."""
    gpu_only = re.compile(r"\btorchrun\b.*--nproc[-_]per[-_]node[ =]gpu\b")
    assert gpu_only.search("torchrun --nproc-per-node gpu src/train_DDP.py")  # what it looks for
    if torch.cuda.is_available():
        return  # there, the GPU lines run as written
    found = [f"{where}: {command}" for where, command in all_commands() if gpu_only.search(command)]
    assert not found, "\n".join(found)


def test_the_probe_fails_a_flag_the_script_does_not_have(tmp_path):
    """The check above can fail: a misspelt flag, a value outside a flag's choices and a combination that
    common.parse_args refuses are caught; a valid bench line passes."""
    todo = tmp_path / "lines.json"
    lines = [
        ["x:1", "src/train_amp.py", ["--amp-dtype", "bfloat16"]],
        ["x:2", "src/train_amp.py", ["--amp-type", "bfloat16"]],
        ["x:3", "src/train_compile.py", ["--compile-mode", "fastest"]],
        ["x:4", "src/train.py", ["--resume"]],  # common.parse_args's own check: --resume needs --checkpoint-dir
        ["x:5", "bench/bench.py", ["--profile", "cpu", "--repeats", "2"]],
    ]
    todo.write_text(json.dumps(lines))
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "runline_probe.py"), str(todo)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1
    failing = proc.stdout.splitlines()
    assert [line.split(":")[1] for line in failing] == ["2", "3", "4"], proc.stdout
    assert "unrecognized arguments: --amp-type" in failing[0] and "invalid choice: 'fastest'" in failing[1]
    assert "--resume needs --checkpoint-dir" in failing[2]


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), start=1):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"[a-z]+:", target) or target.startswith("#"):
                    continue  # a web address or an anchor on the same page
                if not (page.parent / target.split("#")[0]).exists():
                    broken.append(f"{page.relative_to(REPO)}:{n}: {target}")
    assert not broken, "\n".join(broken)


def test_the_readme_is_short_and_links_one_page_per_technique():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for script in (REPO / "src").glob("*.py"):  # the scripts (src/common/ is a package)
        page = f"docs/techniques/{script.stem}.md"
        assert (REPO / page).is_file() and f"({page})" in readme, f"{page}: missing, or not linked from README"


# -- The pages quote the results of the current scripts -----------------------------------------------------------
# A page names its evidence beside the number: a results folder (`results/<folder>/`, often a link to its table.md).
# results/archive/ holds superseded folders; its README.md (the index of what each held and why it went) is not
# evidence and may be linked, nothing under it may be cited.
RESULTS = REPO / "results"
ARCHIVE = re.compile(r"results/archive/([^\s)\]`'\"<>|,;]*)")
FOLDER = re.compile(r"results/([A-Za-z0-9][\w.-]*)/")
# What a page quotes as measured: a ratio (1.50×, with its min–max when given: 1.50× (1.22–1.57)) or a rate
# (1,240.0 images/s, 8,824 tokens/s (8409–11523)). Dimensions are written with spaces (2 × 64), ratios without.
NUMBER = r"\d[\d,]*(?:\.\d+)?"
RANGE = rf"(?:\s*\(({NUMBER})–({NUMBER})\))?"
RATE = r"\s?(?:images/s|img/s|tokens/s)"
QUOTED = re.compile(rf"({NUMBER})×{RANGE}|({NUMBER}){RATE}{RANGE}")
RATIO_IN_FILES = re.compile(rf"({NUMBER})×")
SPREAD_IN_FILES = re.compile(rf"({NUMBER})(?:×|{RATE})?\s*\(({NUMBER})–({NUMBER})\)")
IN_FILES = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")


def archive_citations(text: str) -> list[tuple[int, str]]:
    """(line, path) of each path under results/archive/ other than the folder's own name and its README.md index."""
    return [
        (n, f"results/archive/{tail}")
        for n, line in enumerate(text.splitlines(), start=1)
        for tail in ARCHIVE.findall(line)
        if tail not in ("", "README.md")
    ]


def test_no_page_cites_an_archived_result_folder_as_evidence():
    """README.md, docs/*.md and docs/techniques/*.md quote only result folders of the current scripts; the check
    itself is shown to fail on a link into an archived folder and to pass the archive's index."""
    assert archive_citations("[`x/`](../../results/archive/cpu-2core-2026-11-23/table.md)")
    assert not archive_citations("superseded: [`results/archive/`](results/archive/README.md)")
    found = [
        f"{page.relative_to(REPO)}:{n}: {path}" for page in PAGES for n, path in archive_citations(page.read_text())
    ]
    assert not found, "\n".join(found)


def _value(text: str) -> float:
    return float(text.replace(",", ""))


_FOLDERS: dict[str, dict] = {}


def folder_holds(folder: str) -> dict:
    """What a result folder's own files (*.md, *.csv, *.txt, *.json at its top, not its logs) hold: every number
    (1,234.5 read as 1234.5), the ratios (a number and ×) and the spreads (a ratio or rate with its (min–max))."""
    if folder not in _FOLDERS:
        numbers, ratios, spreads = set(), set(), set()
        for path in sorted((RESULTS / folder).iterdir()):
            if path.is_file() and path.suffix in (".md", ".csv", ".txt", ".json"):
                text = path.read_text(errors="replace")
                numbers.update(_value(n) for n in IN_FILES.findall(text))
                ratios.update(_value(n) for n in RATIO_IN_FILES.findall(text))
                spreads.update(tuple(_value(n) for n in m) for m in SPREAD_IN_FILES.findall(text))
        _FOLDERS[folder] = {"numbers": numbers, "ratios": ratios, "spreads": spreads}
    return _FOLDERS[folder]


def rounds_to(quoted: str, value: float) -> bool:
    """Whether value, rounded to the quoted number's decimals, is the quoted number (0.88 for 0.8812)."""
    text = quoted.replace(",", "")
    return abs(float(text) - value) <= 0.5 * 10.0 ** -len(text.partition(".")[2]) + 1e-9


def held(quoted: tuple[str, ...], kind: str, folders: list[str]) -> bool:
    """Whether a folder holds what a page quotes: a value with its (min–max) as one spread, a ratio among the ratios,
    a rate among the numbers; each to the quoted number of decimals."""
    for folder in folders:
        holds = folder_holds(folder)
        if len(quoted) == 3:
            if any(all(map(rounds_to, quoted, spread)) for spread in holds["spreads"]):
                return True
        elif any(rounds_to(quoted[0], v) for v in holds["ratios" if kind == "ratio" else "numbers"]):
            return True
    return False


def line_folders(text: str):
    """(line number, line, folders) of each line outside ``` blocks that names a result folder or sits in a table
    whose caption does: a line's folders are those it names; a table row's, those it names and those named in the
    paragraph just above its table (its caption: the README's table names its two default folders there). Folders that do not exist and results/archive/ (cited nowhere) are left out."""
    block, paragraph, table, fresh = False, [], None, True
    for n, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            block = not block
            continue
        if block:
            continue
        named = [f for f in FOLDER.findall(line) if f != "archive" and (RESULTS / f).is_dir()]
        if line.lstrip().startswith("|"):
            table = paragraph if table is None else table
            folders, fresh = list(dict.fromkeys(named + table)), True
        elif not line.strip() or line.startswith("#"):
            table, fresh = None, True
            paragraph = [] if line.startswith("#") else paragraph
            continue
        else:
            table = None
            paragraph, fresh = ([] if fresh else paragraph) + named, False
            folders = named
        if folders:
            yield n, line, folders


def unheld_numbers(text: str) -> list[tuple[int, str, list[str]]]:
    """(line, number, folders) of each ratio or rate a line quotes that the result folders it names (`line_folders`)
    do not hold."""
    found = []
    for n, line, folders in line_folders(text):
        for match in QUOTED.finditer(line):
            groups = match.groups()
            kind, quoted = ("ratio", groups[:3]) if groups[0] else ("rate", groups[3:])
            quoted = tuple(q for q in quoted if q)
            if not held(quoted, kind, folders):
                found.append((n, match.group(0), folders))
    return found


def floor_pct(folder: str) -> float | None:
    """A result folder's noise floor in percent (bench/pages/results_index.py reads its floors.json), None where it
    has none."""
    sys.path.insert(0, str(REPO / "bench" / "pages"))
    import results_index

    return results_index.floor_pct(RESULTS / folder)


def verdicts_beyond_the_floor(text: str) -> list[tuple[int, list[str]]]:
    """(line, folders) of each "no measurable difference" whose folders' floors are all wider than ±15 %, or not
    measured: within such a floor the bench gives no verdict (bench/pairs.py NOISY_FLOOR), and a page may not."""
    found = []
    for n, line, folders in line_folders(text):
        if "no measurable difference" in line:
            floors = [floor_pct(f) for f in folders]
            if not any(f is not None and f <= 15 for f in floors):
                found.append((n, folders))
    return found


def test_no_page_prints_a_verdict_its_folder_s_floor_does_not_allow():
    """ "No measurable difference" on a page needs a folder whose noise floor is measured and at most ±15 %; within
    a wider floor the bench prints "no verdict" (the README once printed it from attention-2026-11-25's ±26.2 %).
    Shown to fail on that line."""
    assert verdicts_beyond_the_floor(
        "0.94× (0.91–1.07), no measurable difference ([t](results/attention-2026-11-25/table.md))"
    )
    assert not verdicts_beyond_the_floor(
        "0.94×, no measurable difference ([t](results/cpu-2core-avx512bf16-2026-11-27/table.md))"
    )
    found = [
        f"{page.relative_to(REPO)}:{n}: {folders}"
        for page in PAGES
        for n, folders in verdicts_beyond_the_floor(page.read_text())
    ]
    assert not found, "\n".join(found)


def test_every_ratio_and_rate_a_page_quotes_is_in_the_result_folder_it_names():
    """Each ratio (1.50×, its min–max) and rate (images/s, tokens/s) on a line that names a result folder, or in a
    table whose caption names one, is in that folder's table.md, ladder.md, summary.csv, pairs.csv, README.md...
    (thousands separators and rounding to the quoted decimals allowed). Shown to fail on a changed digit."""
    folder = "cpu-2core-avx512bf16-2026-11-27"  # its train_channels_last.py cnn, float32 row
    row = f"5,278.1 images/s, 1.39× (1.38–1.44), faster ([table](results/{folder}/table.md))"
    assert not unheld_numbers(row)
    assert [q for _, q, _ in unheld_numbers(row.replace("1.38", "1.37"))] == ["1.39× (1.37–1.44)"]
    assert [q for _, q, _ in unheld_numbers(row.replace("5,278.1", "5,278.2"))] == ["5,278.2 images/s"]
    caption = f"From [`{folder}/`](results/{folder}/ladder.md):\n\n| rung | × |\n|---|---|\n| compile | 0.73× |\n"
    assert [q for _, q, _ in unheld_numbers(caption)] == ["0.73×"]  # a table row takes its caption's folder
    found = [
        f"{page.relative_to(REPO)}:{n}: {q} is in none of {', '.join(folders)}"
        for page in PAGES
        for n, q, folders in unheld_numbers(page.read_text())
    ]
    assert not found, "\n".join(found)


def unknown_tests(text: str, defined: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each test a text names (`test_` and three words or more, so not a variable such as test_set,
    nor a file such as test_gpt.py) that is not in `defined`."""
    return [
        (n, name)
        for n, line in enumerate(text.splitlines(), start=1)
        for name in re.findall(r"\b(test(?:_[a-z0-9]+){3,})\b(?!\.py)", line)
        if name not in defined
    ]


def test_every_test_a_page_names_exists():
    """A page that names a test names one that tests/ defines, so its description cannot drift from a renamed or
    removed test unnoticed; shown to catch the name a page once kept after its test was renamed."""
    defined = {m for path in (REPO / "tests").glob("*.py") for m in re.findall(r"def (test_\w+)", path.read_text())}
    stale = "test_fsdp_matches_ddp_and_resumes_from_its_sharded_checkpoint_bit_for_bit"
    assert unknown_tests(f"`{stale}` in tests/test_equivalence.py, test_set", defined) == [(1, stale)]
    missing = [
        f"{page.relative_to(REPO)}:{n}: {name}"
        for page in PAGES
        for n, name in unknown_tests(page.read_text(), defined)
    ]
    assert not missing, "\n".join(missing)


def unlabelled_gpu_lines(commands_: list[tuple[str, str]]) -> list[str]:
    """Run lines that need a GPU (`--device cuda`) but do not say so ("GPU" in the line or its comment), and run
    lines that name a results/ folder that does not exist: on a CPU-only laptop both fail as written."""
    found = []
    for where, command in commands_:
        for script, args in run_lines(command):
            if re.search(r"--device[ =]cuda\b", " ".join(args)) and "GPU" not in command:
                found.append(f"{where}: needs a GPU and does not say so: {command}")
            missing = [a for a in args if a.startswith("results/") and "{" not in a and not (REPO / a).exists()]
            if missing and "--out" not in args[max(0, args.index(missing[0]) - 1) : args.index(missing[0])]:
                found.append(f"{where}: {', '.join(missing)} does not exist: {command}")
    return found


def test_every_run_line_that_needs_a_gpu_says_so_and_names_folders_that_exist():
    """Every run line in the README, docs/ and the docstrings works as written on a CPU-only laptop or says what it
    needs; shown to catch the two kinds of line --help once printed."""
    assert unlabelled_gpu_lines([("x", "python src/train.py --device cuda")])
    assert not unlabelled_gpu_lines([("x", "python src/train.py --device cuda   # on a GPU")])
    assert unlabelled_gpu_lines([("x", "python bench/pages/diff_pages.py --out d --results results/cpu-2core")])
    found = unlabelled_gpu_lines(all_commands())
    assert not found, "\n".join(found)


# -- results/README.md, the index of the committed results --------------------------------------------------------


def test_the_results_index_is_current_and_every_folder_opens_on_its_table_or_says_why_not():
    """results/README.md is what `bench/pages/results_index.py` writes now (from results/current.toml and the folders:
    a folder added, archived or re-run without the index written again fails here); it names every folder under
    results/ that git tracks or current.toml names, each current topic's folder first; each of them has a table.md,
    or a README.md that says why not; and current.toml names only folders that are there, each once."""
    proc = subprocess.run([sys.executable, "bench/pages/results_index.py", "--check"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sys.path.insert(0, str(REPO / "bench" / "pages"))
    import results_index

    index = (REPO / "results" / "README.md").read_text()
    for name in results_index.result_folders():
        assert f"[`{name}/`]({name}/" in index, f"results/README.md does not name {name}/"
        folder = REPO / "results" / name
        assert (folder / "table.md").is_file() or (folder / "README.md").is_file(), (
            f"{name}/ has no table.md or README.md"
        )
    import tomllib

    current = [t["folder"] for t in tomllib.loads((REPO / "results" / "current.toml").read_text())["topic"]]
    assert len(current) == len(set(current)) and set(current) <= set(results_index.result_folders())
    assert index.index("## Current") < min(index.index(f"[`{name}/`]") for name in current) < index.index("## Older")


def test_a_user_s_own_results_folder_leaves_the_index_current():
    """A folder of a user's own runs under results/ that git does not track (`python bench/bench.py --out
    results/mine`) is theirs: the index does not list it and its --check still passes (it once failed every test run
    after such a run: "results/README.md is stale"). Shown to fail with the folders read from disk alone."""
    sys.path.insert(0, str(REPO / "bench" / "pages"))
    import results_index

    mine = REPO / "results" / f"mine-{os.getpid()}"
    try:
        mine.mkdir()
        (mine / "table.md").write_text("# my own runs\n")
        assert mine.name not in results_index.result_folders()
        proc = subprocess.run([sys.executable, "bench/pages/results_index.py", "--check"], cwd=REPO,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    finally:
        shutil.rmtree(mine, ignore_errors=True)


def test_a_new_result_folder_joins_the_index_before_git_knows_it(tmp_path, monkeypatch):
    """Where git cannot say what it tracks (results/ outside a repository), the index lists the folders on disk: a
    folder nobody has added yet is listed; archive/, mutations/, local/ and hidden folders are not. In the repository,
    a new topic's folder joins it by its line in current.toml, before its first `git add`."""
    sys.path.insert(0, str(REPO / "bench" / "pages"))
    import results_index

    for name in ("cpu-2core-new", "archive", "mutations", "local", ".cache"):
        (tmp_path / name).mkdir()
    (tmp_path / "current.toml").write_text("")
    monkeypatch.setattr(results_index, "RESULTS", tmp_path)
    assert results_index.result_folders() == ["cpu-2core-new"]


def test_the_readme_s_chain_tree_and_docs_scripts_md_are_written_from_the_declarations(tmp_path):
    """The README's chain tree and docs/scripts.md (a row per script: its title, declared base, what it adds, first
    run line) are what bench/pages/pages.py writes from the scripts' docstrings (its --check above fails when
    either is stale); a new script's docstring is all it takes to get its tree line and its row."""
    sys.path.insert(0, str(REPO / "bench" / "pages"))
    import pages

    assert pages.chains_block() in (REPO / "README.md").read_text()
    assert (REPO / "docs" / "scripts.md").read_text() == pages.scripts_page()
    assert "| [`train_amp.py`](techniques/train_amp.md) | Mixed precision (AMP) | `train.py` |" in pages.scripts_page()
    (tmp_path / "train.py").write_text((REPO / "src" / "train.py").read_text())
    tf32 = (REPO / "src" / "train_tf32.py").read_text().replace("src/train_tf32.py", "src/train_foreach.py")
    declared = '"""Foreach: train.py + AdamW with foreach=True.'
    (tmp_path / "train_foreach.py").write_text(tf32.replace(tf32.split("\n")[0], declared))
    row = next(line for line in pages.scripts_page(tmp_path).splitlines() if "train_foreach.py" in line)
    assert "| Foreach | `train.py` | AdamW with foreach=True | `python src/train_foreach.py --device cpu" in row, row
    assert "└── train_foreach.py" in pages.chains_block(tmp_path)


def test_no_committed_result_folder_carries_side_by_side_pages():
    """The side-by-side pages (index.html, diff-*.html, chain-*.html) are the scripts of one commit, so a committed
    folder does not repeat them (they were 726 files, 40 MB of results/'s 78): `python bench/pages/diff_pages.py
    --out DIR --results results/FOLDER` at the folder's commit writes them again; the bench writes them into a
    user's own results/local/ (or a folder outside results/), never into another folder of results/."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "results"], capture_output=True, text=True,
                            check=True).stdout.splitlines()  # fmt: skip
    pages = [f for f in listed if re.search(r"/(diff-[^/]*|chain-[^/]*|index)\.html$", f)]
    assert not pages, pages[:5]


def test_the_nanogpt_side_by_side_page_is_what_its_script_writes_from_its_runs(tmp_path):
    """A nanoGPT side-by-side folder's README.md (the README's laptop line quotes it) is what `bench/studies/nanogpt.py
    --tables-only` writes from its runs/ now: a number typed into the page, or a run measured again without the page
    written again, fails here. Shown to fail on one run's seconds changed in a copy."""
    import shutil

    sys.path.insert(0, str(REPO / "bench" / "studies"))
    import nanogpt

    folders = [p.parent for p in sorted(RESULTS.glob("nanogpt-to-target-*/runs")) if p.is_dir()]
    assert folders, "no results/nanogpt-to-target-*/ folder with runs/"
    for folder in folders:
        assert (folder / "README.md").read_text() == nanogpt.readme(folder), f"{folder.name}/README.md is stale"
    copy = tmp_path / folders[-1].name
    shutil.copytree(folders[-1], copy)
    run = sorted((copy / "runs").glob("train_fast-*.json"))[0]
    data = json.loads(run.read_text())
    data["time_to_target_s"] += 1.0
    run.write_text(json.dumps(data))
    assert nanogpt.readme(copy) != (folders[-1] / "README.md").read_text()


def test_the_tracked_tree_fits_a_gpu_lease_with_room_to_carry():
    """A GPU rented by the quarter-hour gets the tree copied to it each time, with the data, torchao's wheel and a
    compile cache beside it (docs/bench.md, bench/lease.sh): the tracked files stay under 48 MiB so that the copy is
    quick. On 2026-11-28 results/ held 78 MB, half of it side-by-side pages, and the copy was refused at first."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout
    sizes = [(REPO / name).stat().st_size for name in listed.decode().split("\0") if name and (REPO / name).is_file()]
    assert sum(sizes) < 48 * 2**20, f"the tracked files hold {sum(sizes) / 2**20:.1f} MiB"


def test_each_technique_page_s_measured_block_is_the_current_folders_rows():
    """Every technique page's "Measured now" block is what `bench/pages/pages.py` writes now from the folders
    results/current.toml names (a re-run folder, or a hand edit inside the block, fails here): every row of the
    page's script, its rate and comparison as the folder's summary.csv holds them, with the folder's floor; and a
    verdict is printed only as that floor allows (past a floor wider than ±15 %, neither a ratio nor a verdict:
    "no verdict (floor ±N %)"; without a floor, no verdict)."""
    proc = subprocess.run([sys.executable, "bench/pages/pages.py", "--check"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sys.path.insert(0, str(REPO / "bench" / "pages"))
    import pages

    amp = (REPO / "docs" / "techniques" / "train_amp.md").read_text()
    inside = amp[amp.index(pages.BEGIN) : amp.index(pages.END) + len(pages.END)]
    assert "| CPU ladders (" in inside and "train_amp.py cnn, bf16" in inside
    edited = amp.replace(inside, re.sub(r"(\d)\.(\d\d)×", lambda m: f"{m[1]}.{int(m[2]) + 1:02d}×", inside, count=1))
    assert edited != amp and pages.with_block(edited, inside) == amp  # the check writes the folder's value back
    assert pages.allowed("1.09× (0.97–1.20), no measurable difference over a", 0.262) == (
        "no verdict (floor ±26 %) over a"
    )
    assert pages.allowed("3.80× (1.10–6.50), faster over a", 0.526) == "no verdict (floor ±53 %) over a"
    assert pages.allowed("0.19× (0.18–0.20), slower", 0.2) == "no verdict (floor ±20 %)"
    assert "3.80×" not in (REPO / "README.md").read_text()
    assert pages.allowed("1.30× (1.25–1.33), faster over a", 0.05) == "1.30× (1.25–1.33), faster over a"
    assert (
        pages.allowed("1.30× (1.25–1.33), faster over a", None)
        == "1.30× (1.25–1.33), no verdict (no noise floor) over a"
    )


def test_the_readme_s_table_has_a_row_for_every_script_and_names_its_cells_folders_rows():
    """The README's "Every technique, measured" table is bench/pages/pages.py's (the --check above holds it to the
    folders): every script of src/ has a row in bench/pages/readme_table.toml, and a cell whose configuration is not
    a row of its topic's current folder (a re-run that renamed it) stops the writing with one line, not a blank cell."""
    sys.path.insert(0, str(REPO / "bench" / "pages"))
    import pages

    spec = pages.load_readme_spec()
    rows = {row["script"] for row in spec["row"]} | {row["also"] for row in spec["row"] if "also" in row}
    missing = sorted(p.name for p in (REPO / "src").glob("*.py") if p.name not in rows)
    assert not missing, f"bench/pages/readme_table.toml has no row for {missing}"
    readme = (REPO / "README.md").read_text()
    assert pages.BEGIN in readme and "| [`train_amp.py`](docs/techniques/train_amp.md)" in readme
    folders = pages.Folders(pages.load_topics())
    cell = {"topic": "CPU ladders", "config": "train_amp.py cnn, bf16", "label": "x", "show": "ratio"}
    ratio = pages.cell_value(cell, folders)
    assert re.fullmatch(r"\d\.\d\d× \(\d\.\d\d–\d\.\d\d\), .+", ratio), ratio
    with pytest.raises(SystemExit, match="has no row 'train_amp.py cnn, renamed'"):
        pages.cell_value({**cell, "config": "train_amp.py cnn, renamed"}, folders)


# -- Pages say only what stays true, or what a script writes and a test checks ------------------------------------
# A page that says how the repository stands today ("src/ unchanged since", "the gpu profile has 13 configurations")
# is true the day it is written and false after the next commit that no page edit follows. The tracked pages (the
# README, docs/, and the result folders' table.md, ladder.md and README.md, results/archive/ apart: it is history)
# state such facts only where a script writes them and a test checks them, or in words that stay true (the commit
# that made a folder, and the command that shows what changed since).
STALE = {
    r"unchanged since": "a page cannot know that src/ stays so: name the commit, and `git diff --stat COMMIT -- src/`",
    r"made by the current scripts": "the scripts change after the page is written: name the commit",
    r"made by an older version of the scripts": "name the commit, and `git diff --stat COMMIT -- src/`",
    r"src/ has changed since in": "the list of changed files grows with every commit: give the command that lists them",
    r"\bthe current scripts\b": "current for how long? name the commit",
    r"the current `src/`": "name the commit",
    r"says whether `?src/`? changed": "the tables give the commit and the command, not a verdict on today's src/",
    r"\bthe last (?:GPU )?lease\b": "the last one until the next: name the folder or the date",
}
COUNT = re.compile(r"`([\w.-]+)`[^.;|`]*?\b(\d+) configurations\b|\b(\d+)-configuration `([\w.-]+)`")


def tracked_pages() -> list[Path]:
    """The pages git tracks that a reader opens: README.md, docs/**/*.md, and under results/ (not results/archive/)
    every table.md, ladder.md and README.md."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "README.md", "docs/*.md", "results/*table.md",
                             "results/*ladder.md", "results/*README.md"], capture_output=True, text=True,
                            check=True).stdout.split()  # fmt: skip
    return [REPO / name for name in listed if not name.startswith("results/archive/") and (REPO / name).is_file()]


def profile_counts() -> dict[str, int]:
    """Each profile of bench/profiles.toml and its number of configurations (its [[PROFILE.runs]] tables)."""
    import tomllib

    profiles = tomllib.loads((REPO / "bench" / "profiles.toml").read_text())
    return {name: len(table.get("runs", [])) for name, table in profiles.items()}


def present_tense_claims(text: str, counts: dict[str, int]) -> list[tuple[int, str]]:
    """(line, why) of each statement about the repository's present state that no script checks: a STALE phrase, or
    a count of a profile's configurations that bench/profiles.toml does not hold (a table row's count is its first
    cell's profile's; elsewhere the profile named before the count in the same clause)."""
    found = []
    for n, line in enumerate(text.splitlines(), start=1):
        found += [
            (n, f"{m.group(0)!r}: {why}")
            for pattern, why in STALE.items()
            for m in re.finditer(pattern, line, re.IGNORECASE)
        ]
        first = re.match(r"\|\s*`([\w.-]+)`\s*\|", line)
        if first and first.group(1) in counts:
            claims = [(first.group(1), int(k)) for k in re.findall(r"\b(\d+) configurations\b", line)]
        else:
            claims = [(m.group(1) or m.group(4), int(m.group(2) or m.group(3))) for m in COUNT.finditer(line)]
        found += [
            (n, f"`{name}` has {counts[name]} configurations in bench/profiles.toml, the page says {k}")
            for name, k in claims
            if name in counts and counts[name] != k
        ]
    return found


def test_no_page_states_a_present_tense_fact_about_the_repository_that_no_script_checks():
    """No tracked page says "src/ unchanged since" (or any STALE phrase), and every count of a profile's
    configurations on a page is the count bench/profiles.toml holds. Shown to fail on the line every table.md once
    carried, on docs/bench.md's old "13 configurations" of the gpu profile (both in a table row and in prose), and to
    pass a historical count that names no profile and the provenance line bench/cells.py writes now."""
    counts = {"gpu": 12, "cpu": 24}
    assert present_tense_claims("Provenance: made by the current scripts (commit 3403e734cb, env.json; src/ "
                                "unchanged since).", counts)  # fmt: skip
    assert present_tense_claims("| `gpu` | the default with a GPU, 13 configurations, every comparison |", counts)
    assert present_tense_claims("the `gpu` profile has 13 configurations, in 3 rounds", counts)
    assert not present_tense_claims("| `gpu` | the default with a GPU, 12 configurations |", counts)
    assert not present_tense_claims("The profile then had 19 configurations (57 runs in 3 rounds).", counts)
    sys.path[:0] = [str(REPO / "bench"), str(REPO / "src")]
    from cells import provenance_line

    assert not present_tense_claims(provenance_line(None, {"git": {"commit": "3403e734cb", "dirty": False}}), counts)
    counts = profile_counts()
    found = [
        f"{page.relative_to(REPO)}:{n}: {why}"
        for page in tracked_pages()
        for n, why in present_tense_claims(page.read_text(), counts)
    ]
    assert not found, "\n".join(found)


def test_every_table_s_provenance_line_is_what_bench_cells_writes_now():
    """Each committed table.md and ladder.md (not results/archive/) carries the provenance line that
    bench/cells.py's provenance_line writes from its folder now: the commit, clean or not, where the commit was read,
    and the `git diff --stat` that shows what changed since, with no verdict on today's src/. Shown to fail on the
    line the tables carried before ("src/ unchanged since")."""
    sys.path[:0] = [str(REPO / "bench"), str(REPO / "src")]
    from cells import provenance_line

    def stale(page: Path) -> str | None:
        line = next((x for x in page.read_text().splitlines() if x.startswith("Provenance:")), None)
        want = provenance_line(page.parent, json.loads((page.parent / "env.json").read_text()))
        return None if line is None or line == want else f"{page.relative_to(REPO)}: {line!r}, want {want!r}"

    folder = RESULTS / "cpu-2core-avx512bf16-2026-11-27"
    line = provenance_line(folder, json.loads((folder / "env.json").read_text()))
    assert "3403e734cb" in line and "a clean tree" in line and "`git diff --stat 3403e734cb -- src/`" in line
    assert provenance_line(RESULTS / "activation-checkpointing-gpu-h100-2026-11-26", {}).count("ef6c920bdd") == 2
    pages = [p for p in tracked_pages() if p.name in ("table.md", "ladder.md")]
    assert any(stale(p) is None and "Provenance:" in p.read_text() for p in pages)
    found = [why for why in map(stale, pages) if why]
    assert not found, "\n".join(found) + "\n(rewrite only that line with bench/cells.py's provenance_line)"


def test_a_table_s_header_says_that_its_ratio_is_not_the_ratio_of_the_rates_beside_it():
    """A ratio (× its base) is the median of its pairs' ratios and each rate the median of its row's runs, so a
    table can print 0.12× beside 56,819 against 396,236 tokens/s (results/gpu-h200-2026-11-28): table.md's header
    says which statistic each is, written from a committed folder's summary here, and ladder.md's carries the same
    sentence (bench/bench.py)."""
    sys.path[:0] = [str(REPO / "bench"), str(REPO / "src")]
    import pandas as pd
    import tables
    from cells import RATIO_STATISTICS

    folder = RESULTS / "gpu-h200-2026-11-28"
    summary = pd.read_csv(folder / "summary.csv")
    env = json.loads((folder / "env.json").read_text())
    text = tables.table_markdown(summary, env, "gpu", "1 run(s)", None, folder)
    header = text.split("\n## ")[0]
    assert RATIO_STATISTICS in header and "median of its pairs' ratios" in RATIO_STATISTICS
    assert "{RATIO_STATISTICS}" in (REPO / "bench" / "bench.py").read_text()  # ladder.md's header


def test_the_gpu_paragraph_says_what_run_all_sh_runs_on_a_gpu_machine():
    """docs/bench.md says which profile `bash run_all.sh` runs where torch sees a GPU and where it does not: the
    profile bench/bench.py's `the_matrix` picks for `--profile auto` (its default) with 1 GPU and with none."""
    sys.path[:0] = [str(REPO / "bench"), str(REPO / "src")]
    import bench

    argv, sys.argv = sys.argv, ["bench.py", "--dry-run"]
    try:
        parser, args = bench.parse_args()
        on_gpu = bench.the_matrix(parser, args, gpus=1, bf16=True)[0]
        parser, args = bench.parse_args()
        on_cpu = bench.the_matrix(parser, args, gpus=0, bf16=True)[0]
    finally:
        sys.argv = argv
    said = f"`--profile auto`, its default, is `{on_gpu}` where torch sees a CUDA GPU and `{on_cpu}`"
    assert said in " ".join((REPO / "docs" / "bench.md").read_text().split()), said


def index_cells(index: str, name: str) -> dict[str, str]:
    """The commit, floor and verdicts cells of a folder's line in results/README.md."""
    line = next(x for x in index.splitlines() if f"[`{name}/`]" in x)
    cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]  # the older folders' lines start with it
    k = next(i for i, c in enumerate(cells) if c.startswith(f"[`{name}/`]"))
    return {"commit": cells[k + 3], "floor": cells[k + 4], "verdicts": cells[k + 6]}


def test_the_results_index_reads_every_folder_as_its_pages_do():
    """results/README.md gives each folder the commit its tables' provenance line names (provenance.json's
    correction before env.json: the GPU activation-checkpointing folder's ef6c920bdd, not 823157c), the noise floor
    its pages read (its floors.json's: the nanoGPT side by side's study writes one too), and counts no verdict
    where no floor was measured (the small ViT's defaults, whose technique page prints "no verdict")."""
    sys.path[:0] = [str(REPO / "bench" / "pages"), str(REPO / "bench"), str(REPO / "src")]
    import results_index
    from cells import folder_commit

    assert results_index.judged("faster", None) == "no verdict"
    assert results_index.judged("no measurable difference", 26.2) == "no verdict"
    assert results_index.judged("faster", 26.2) == "no verdict"  # as the pages print it: no ratio past ±15 %
    assert results_index.judged("slower", 2.6) == "slower" and results_index.judged("disturbed", None) == "disturbed"
    index = (RESULTS / "README.md").read_text()
    for name in results_index.result_folders():
        folder, cells = RESULTS / name, index_cells(index, name)
        env = json.loads((folder / "env.json").read_text()) if (folder / "env.json").is_file() else {}
        commit = folder_commit(folder, env)[0]
        assert commit and cells["commit"].startswith(commit[:10]), (name, cells["commit"], commit)
        floor = results_index.floor_pct(folder)
        if floor is not None:
            assert cells["floor"] == f"±{floor:.1f} %", (name, cells["floor"])
        else:
            assert not re.search(r"faster|slower|no measurable difference", cells["verdicts"].split(";")[0]), (
                name, cells["verdicts"])  # fmt: skip

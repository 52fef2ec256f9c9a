"""The README and docs/ say what the code does: every run line parses with its script's own parser, every relative
link resolves, and the README stays short.

Run lines are read from README.md, every page under docs/ (inside ``` blocks, one command a line, `\\` continuing
it, and inside `code spans`) and every script's docstring (its indented run lines, which --help also prints): each
`python <script>.py ...`, `torchrun <its flags> <script>.py ...` and `bash run_all.sh ...` (whose flags go to
bench/bench.py). tests/runline_probe.py runs each script until its parser has parsed the line, so an unknown flag or
a value outside a flag's choices fails here as it would for a reader who copies the line.
"""

import ast
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
SCRIPTS = sorted((REPO / "src").glob("*.py")) + sorted((REPO / "bench").glob("*.py"))


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

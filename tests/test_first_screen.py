"""The README's first screen: its numbers are printed by the commands shown with them. bench/pages/pages.py writes the
paragraphs under the Quick start from bench/pages/readme_table.toml's [first_screen] and the folders (tests/test_docs.py
fails when they are stale); here: each row they quote ran the command the README shows, and the Quick start runs as
written on a machine whose Python set-up had to put into .venv/."""

import json
import re
import shlex
import sys
import tomllib
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench" / "pages"))

import common  # noqa: E402
from results_index import load_topics  # noqa: E402

# Flags a bench row may add to a command the README shows, and why the number quoted stays the command's: where the
# metrics go, how often the loss is logged, the sample text printed at the end, and the probe's period when it is the
# default the README's command gets.
PRINTING_ONLY = {"--metrics-out", "--log-every", "--sample-chars"}


def quick_start() -> list[str]:
    """The Quick start's command lines, comments removed."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"## Quick start\n+```bash\n(.*?)```", text, re.DOTALL).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def first_screen_commands() -> list[list[str]]:
    """Every `python src/...` command the first screen shows: the Quick start's and those quoted in its text and in
    its details (the section it links to)."""
    spec = tomllib.loads((REPO / "bench/pages/readme_table.toml").read_text())["first_screen"]
    quoted = re.findall(r"`(python src/[^`]+)`", spec["text"] + spec.get("more", ""))
    return [shlex.split(c) for c in quick_start() + quoted if c.startswith("python src/")]


def shown_as(command: str, shown: list[list[str]], cpu_only: bool) -> list[str] | None:
    """The shown command (argv) that a bench row's `command` ran, once the interpreter, the printing-only flags, the
    default probe period and (on a machine without a GPU) `--device cpu` are set aside; None when none matches."""
    argv = shlex.split(command)[1:]  # the interpreter, as the bench ran it
    script = argv[0][argv[0].rindex("src/"):]  # the path as the bench's checkout had it: from src/ on
    default_every = str(common.cli.get_parser().get_default("eval_every"))
    kept, i = [], 1
    while i < len(argv):
        flag, value = argv[i], argv[i + 1] if i + 1 < len(argv) else None
        if flag in PRINTING_ONLY or (flag == "--eval-every" and value == default_every):
            i += 2
        elif flag == "--device" and value == "cpu" and cpu_only:
            i += 2
        else:
            kept.append(flag)
            i += 1
    for line in shown:
        if line[1] == script and sorted(line[2:]) == sorted(kept):
            return line
    return None


def test_the_quick_start_sets_up_then_makes_that_python_the_shell_s_before_its_first_python_line():
    lines = quick_start()
    assert lines[0] == "bash bench/setup.sh", lines
    first_python = next(i for i, line in enumerate(lines) if line.startswith("python "))
    assert ". bench/activate.sh" in lines[:first_python], lines
    assert (REPO / "bench/activate.sh").is_file()


def test_every_row_the_first_screen_quotes_ran_a_command_the_first_screen_shows():
    """Each [first_screen] cell of a time to the target (the number a command prints at its end): every run of that
    row in its folder is one of the commands the first screen shows (the Quick start's, or one quoted in its text), up
    to flags that only change what is printed. A row measured with another recipe, another --target-sample or another
    model fails here."""
    spec = tomllib.loads((REPO / "bench/pages/readme_table.toml").read_text())["first_screen"]
    folders = {t["name"]: t["folder"] for t in load_topics()}
    shown = first_screen_commands()
    assert any("--target-loss" in line for line in shown), "the laptop line's command reports its time to the target"
    checked = 0
    for name, cell in spec["cells"].items():
        if cell["show"] not in ("target_s", "target_steps", "target_incl_compile_s"):
            continue
        folder = REPO / "results" / folders[cell["topic"]]
        env = json.loads((folder / "env.json").read_text())
        runs = pd.read_csv(folder / "runs.csv")
        commands = runs.loc[(runs["config"] == cell["config"]) & (runs["status"] == "ok"), "command"]
        assert len(commands), f"{name}: {folder.name} has no ok run of {cell['config']!r}"
        for command in commands:
            assert shown_as(command, shown, cpu_only=not env.get("gpus")), (
                f"{name}: {folder.name}'s {cell['config']!r} ran `{command}`, not a command the first screen shows"
            )
        checked += 1
    assert checked >= 3, "the first screen quotes rows of the folders"


def words(text: str) -> list[str]:
    """The words of a Markdown text as a reader counts them: each run of non-space characters with a letter or a digit
    (a table's pipes and rules are not words; a number, a link or a `command` fragment is one)."""
    return [token for token in text.split() if re.search(r"[A-Za-z0-9]", token)]


def test_the_first_screen_reads_in_half_a_minute():
    """What the README shows under its Quick start, as bench/pages/pages.py writes it: at most 200 words, numbers
    included (it once held 492 words and three nested comparisons); the rest is in the section it links to. "×" is a
    table's sign, never prose's "against". Shown to fail on the first screen as it was."""
    text = (REPO / "README.md").read_text()
    begin, end = "<!-- first screen:", "<!-- /first screen -->"
    screen = text[text.index(begin) : text.index(end)].split("\n", 1)[1]
    assert len(words(screen)) <= 200, f"{len(words(screen))} words"
    prose = [line for line in screen.splitlines() if not line.startswith("|")]
    assert not [line for line in prose if re.search(r"[a-z`)] × ", line)], "× in prose: write against"
    assert len(words("| a | `b c` |\n|---|---|\n| 1.90× (1.82–2.06), sooner |")) == 6

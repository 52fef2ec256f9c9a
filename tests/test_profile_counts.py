"""The run counts that bench/profiles.toml's comments state ("52 runs on a CPU without bf16 instructions, 73 with
them") are the runs the bench plans: a row added to a profile changes its dry run's first line, and the comment with
it (CONTRIBUTING.md, step 6). The configuration counts on the pages are tests/test_docs.py's
(test_no_page_states_a_present_tense_fact_about_the_repository_that_no_script_checks)."""

import re
import sys
from pathlib import Path

from conftest import REPO

sys.path[:0] = [str(REPO / "bench"), str(REPO / "src")]

import pairs  # noqa: E402
from profiles import load_profile, skip_reason  # noqa: E402

PROFILES = REPO / "bench" / "profiles.toml"
CLAIM = re.compile(r"\b(\d+) runs on a CPU without bf16 instructions, (\d+) with them\b")


def header_comments(text: str) -> dict[str, str]:
    """Each profile's comment: the one after its `[name]` line and the comment lines right below, joined."""
    found = {}
    for header in re.finditer(r"^\[([\w-]+)\][ \t]*(#.*)?$", text, re.MULTILINE):
        lines = [header.group(2) or ""]
        for line in text[header.end() + 1 :].splitlines():
            if not line.startswith("#"):
                break
            lines.append(line)
        found[header.group(1)] = " ".join(line.lstrip("#").strip() for line in lines)
    return found


def planned_runs(profile: str, bf16: bool, matrix: Path = PROFILES) -> int:
    """How many runs `bench.py --profile PROFILE --dry-run` lists on a CPU with (or without) bf16 instructions: the
    profile's rows with the self pair the bench adds, those the CPU skips left out, in the profile's rounds."""
    table = load_profile(matrix, profile)
    runs = table["runs"]
    pairs.ensure_self_pair(runs)
    needs_gpu = any(run.get("requires") == "cuda" or "cuda" in run["args"] for run in runs)
    skipped = {run["name"] for run in runs if skip_reason(run, int(needs_gpu), bf16)}
    jobs, _ = pairs.plan(runs, table.get("pairs", pairs.MIN_PAIRS), skipped)
    return len(jobs)


def wrong_counts(text: str, matrix: Path = PROFILES) -> list[str]:
    """Each run count a profile's comment states that its plan does not hold, as a line naming both."""
    wrong = []
    for profile, comment in header_comments(text).items():
        for claim in CLAIM.finditer(comment):
            for bf16, stated in ((False, int(claim.group(1))), (True, int(claim.group(2)))):
                runs = planned_runs(profile, bf16, matrix)
                if runs != stated:
                    where = "with" if bf16 else "without"
                    wrong.append(f"[{profile}] says {stated} runs {where} bf16 instructions; its dry run plans {runs}")
    return wrong


def test_a_profile_s_comment_states_the_runs_its_dry_run_plans(tmp_path):
    """Every "N runs on a CPU without bf16 instructions, M with them" in a profile's comment is its plan's count,
    computed for both kinds of CPU whatever this one is (`skip_reason` takes the kind). Shown to fail on a comment
    one row behind."""
    text = PROFILES.read_text()
    claim = CLAIM.search(header_comments(text)["cpu"])
    assert claim, "the cpu profile's comment states its runs"
    assert wrong_counts(text) == []
    without = f"{claim.group(1)} runs on a CPU without"  # the comment of a profile given 3 runs more, not updated
    stale = text.replace(without, f"{int(claim.group(1)) - 3} runs on a CPU without", 1)
    assert stale != text and len(wrong_counts(stale)) == 1

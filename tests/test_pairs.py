"""bench/pairs.py: the interleaved schedule, the ratios' spread and verdict on known inputs; and the provenance of
every result folder (its commit is in this repository's history)."""

import json
import subprocess
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))

import pairs  # noqa: E402
from pairs import Comparison  # noqa: E402


def test_pairs_beyond_the_floor_on_one_side_are_faster_or_slower_and_pairs_that_straddle_1_are_not():
    floor = 0.03
    assert pairs.verdict([1.33, 1.37, 1.42], floor) == "faster"
    assert pairs.verdict([0.81, 0.84, 0.90], floor) == "slower"
    assert pairs.verdict([0.97, 1.05, 1.20], floor) == "no measurable difference"  # straddles 1
    assert pairs.verdict([1.01, 1.02, 1.025], floor) == "no measurable difference"  # all above 1, within the noise
    assert pairs.verdict([1.01, 1.02, 1.025], None) == "faster"  # no floor measured: only the side of 1 counts
    assert pairs.verdict([], floor) == "not measured"
    assert pairs.spread([1.4, 1.33, 1.37]) == (1.37, 1.33, 1.4)  # median, min, max
    assert pairs.noise_floor([0.978, 1.01, 0.963]) == pytest.approx(0.037)
    assert pairs.noise_floor([]) is None
    assert pairs.ratio_cell([1.33, 1.37, 1.42], floor) == "1.37× (1.33–1.42), faster"


LADDER = [
    {"name": "T", "script": "src/train.py", "args": []},
    {"name": "T again", "script": "src/train.py", "args": [], "same_as": "T"},
    {"name": "A", "script": "src/train_amp.py", "args": [], "rung_base": "T"},
    {"name": "C", "script": "src/train_channels_last.py", "args": [], "rung_base": "A"},
    {"name": "L", "script": "src/train_compile.py", "args": [], "rung_base": "C"},
]


def test_every_pair_runs_next_to_its_reference_in_alternating_order_and_a_ladder_shares_its_runs():
    """3 rounds of a ladder T -> A -> C -> L with a self pair on T: each comparison's two runs are adjacent in every
    round, in one order in rounds 0 and 2 and the other in round 1; the ladder's rungs share their runs (each rung
    runs once a round: n runs for n rungs, not 2(n - 1)), and T's run serves its self pair too."""
    found = pairs.comparisons(LADDER)
    assert [(c.row, c.reference, c.kind) for c in found] == [
        ("T again", "T", "same_as"), ("A", "T", "rung_base"), ("C", "A", "rung_base"), ("L", "C", "rung_base")
    ]  # fmt: skip
    jobs, plan = pairs.schedule(found, 3)
    assert [j.index for j in jobs] == list(range(len(jobs)))
    for r in range(3):
        assert [j.config for j in jobs if j.round == r].count("A") == 1  # a rung once a round
    assert [j.config for j in jobs if j.round == 0] == ["T again", "T", "A", "C", "L"]  # T serves both its pairs
    assert [j.config for j in jobs if j.round == 1] == ["L", "C", "A", "T", "T again"]  # round 0 backwards
    order = {}
    for comparison, r, row, reference in plan:
        assert jobs[row].config == comparison.row and jobs[reference].config == comparison.reference
        assert jobs[row].round == jobs[reference].round == r
        assert abs(row - reference) == 1  # adjacent in time
        order.setdefault(comparison, []).append(row > reference)
    assert all(sides == [sides[0], not sides[0], sides[0]] for sides in order.values())  # A B, B A, A B
    assert sorted(r for c, r, *_ in plan if c.row == "C") == [0, 1, 2]
    assert pairs.is_self_pair(found[0], LADDER) and not pairs.is_self_pair(found[1], LADDER)


def test_a_sweep_is_a_chain_and_a_memory_table_a_star():
    matrix = [
        {"name": "w0", "script": "s", "args": [], "sweep": "workers"},
        {"name": "w1", "script": "s", "args": ["1"], "sweep": "workers"},
        {"name": "w2", "script": "s", "args": ["2"], "sweep": "workers"},
        {"name": "ref", "script": "s", "args": [], "memory": "m"},
        {"name": "ac", "script": "t", "args": [], "memory": "m"},
        {"name": "dp", "script": "u", "args": [], "memory": "m"},
    ]
    assert pairs.comparisons(matrix) == [
        Comparison("w1", "w0", "sweep"), Comparison("w2", "w1", "sweep"),
        Comparison("ac", "ref", "memory"), Comparison("dp", "ref", "memory"),
    ]  # fmt: skip
    jobs, plan = pairs.plan(matrix, 2, skipped={"dp"})  # a row this machine skips leaves its comparison out
    assert {c.row for c, *_ in plan} == {"w1", "w2", "ac"} and "dp" not in {j.config for j in jobs}


def test_every_result_folder_names_a_commit_of_this_repository():
    """results/ lists only folders whose env.json (or provenance.json, a recorded correction) names a commit in
    this repository's history (a folder made elsewhere or before provenance goes under results/archive/, with a
    line in its README)."""
    # the folders git tracks: `bash run_all.sh` writes its own (results/local/, or --out results/mine) beside them
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "results"], capture_output=True, text=True).stdout
    names = {line.split("/")[1] for line in tracked.splitlines() if line.count("/") >= 2}
    folders = [REPO / "results" / name for name in sorted(names) if name != "archive"]
    assert folders
    for folder in folders:
        record = folder / "provenance.json" if (folder / "provenance.json").is_file() else folder / "env.json"
        commit = (json.loads(record.read_text()).get("git") or {}).get("commit") or json.loads(record.read_text()).get(
            "commit"
        )
        assert commit, f"{record} names no commit"
        found = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
        assert found.returncode == 0, f"{record}: commit {commit} is not in this repository's history"
    archived = (REPO / "results" / "archive").iterdir() if (REPO / "results" / "archive").is_dir() else []
    readme = (REPO / "results" / "archive" / "README.md").read_text() if archived else ""
    for folder in archived:
        if folder.is_dir():
            assert f"`{folder.name}/`" in readme, f"results/archive/{folder.name} has no line in the archive README"

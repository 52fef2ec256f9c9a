"""floors.json, a result folder's noise floors and verdicts as data (bench/floors.py floors_record): the bench writes it
with its tables and stops where --max-floor says the host is too busy; results/README.md and the pages read it, never
the floors printed in Markdown; the index's headline is the largest effect a folder's floor allows, and it says where
a run stopped early."""

import json
import os
import shutil
import subprocess
import sys

import floors
import pages  # bench/pages/ and bench/ are on the path: tests/conftest.py puts them there
import pairs
import pandas as pd
import pytest
import results_index
from conftest import REPO, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

RESULTS = REPO / "results"
QUICK = ('["--device", "cpu", "--model", "mlp", "--dataset", "synthetic", "--image-size", "28", "--subset", "1024", '
         '"--batch-size", "64", "--epochs", "1", "--warmup-steps", "2", "--workers", "0"]')  # fmt: skip


def test_max_floor_stops_the_bench_once_the_self_pairs_floor_is_past_it_and_the_tables_give_no_verdict(tmp_path):
    """A host too busy for verdicts, made deterministic: every step of the self pair's copy ("T again") takes 1.3
    times as long (tests/slow_steps: a simulated clock, so CI's own load changes nothing), so its three pairs give
    0.769 each, a floor of ±23.1 %, steady (no pair is disturbed). With --max-floor 10 the bench says so in one line
    once the third self pair has run (job 9 of 12: round 3 opens with it), runs nothing more, writes the tables and
    floors.json of what ran with no verdict for any comparison, and exits 3. Without the flag it would run all 12
    runs and exit 0: each assertion below fails then."""
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(
        f"[f]\npairs = 3\nreruns = 2\ntimeout_s = 300\ngemm_seconds = 0.05\n"
        f'[[f.runs]]\nname = "T again"\nscript = "src/train.py"\nargs = {QUICK}\nsame_as = "T"\n'
        f'[[f.runs]]\nname = "T"\nscript = "src/train.py"\nargs = {QUICK}\n'
        f'[[f.runs]]\nname = "U"\nscript = "src/train.py"\nargs = {QUICK.replace("64", "32")}\nrung_base = "T"\n'
    )
    env = {**os.environ, "SLOW_STEPS": json.dumps({"T-again": [0, 10_000, 1.3]}), "SLOW_STEPS_PYTHON": sys.executable,
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "bench/bench.py", "--profile", "f", "--matrix", matrix, "--out", out, "--max-floor", "10",
         "--python", REPO / "tests" / "slow_steps" / "python"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    said = proc.stdout + proc.stderr
    assert proc.returncode == 3, said[-3000:]
    assert "bench: noise floor ±23.1 % is past --max-floor 10 %: this host is too busy for verdicts; stopping" in said
    assert "Traceback" not in said
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 10 and (runs.status == "ok").all(), runs[["config", "status"]]  # jobs 10 and 11 never ran
    record = floors.read_floors(out)
    assert record["floor"] == pytest.approx(1 - 1 / 1.3, abs=1e-3) and record["max_floor"] == pytest.approx(0.10)
    assert (record["pairs_asked"], record["pairs_run"]) == (3, 2)  # U against T: rounds 1 and 2 of 3
    assert "past --max-floor 10 %" in record["stopped"]
    verdicts = {(c["row"], c["kind"]): c["verdict"] for c in record["comparisons"]}
    assert set(verdicts) == {("T again", "same_as"), ("U", "rung_base"), ("U", "first_rung")}
    assert all(v.startswith("no verdict") for v in verdicts.values()), verdicts
    summary = pd.read_csv(out / "summary.csv").set_index("config")
    assert summary.loc["T again", "x_self_verdict"] == "no verdict: noise floor ±23.1 % past --max-floor 10 %"
    table = (out / "table.md").read_text()
    assert "Stopped after 2 of 3 pairs a comparison: noise floor ±23.1 % is past --max-floor 10 %" in table
    # --tables-only judges the same way: env.json holds --max-floor, floors.json why the runs stopped
    proc = run("bench/bench.py", "--out", out, "--matrix", matrix, "--profile", "f", "--tables-only", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert floors.read_floors(out)["stopped"] == record["stopped"]
    assert (
        pd.read_csv(out / "summary.csv").set_index("config").loc["T again", "x_self_verdict"].startswith("no verdict")
    )


@pytest.mark.parametrize("flag", ["0", "-5", "nan", "inf", "ten"])
def test_a_max_floor_that_is_no_percentage_is_one_line(flag):
    proc = run("bench/bench.py", "--profile", "smoke", "--max-floor", flag, "--dry-run", timeout=120)
    assert proc.returncode == 2 and "--max-floor" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def _self_matrix(plan) -> list[dict]:
    """A matrix for pairs.is_self_pair from a folder's plan: a `same_as` row a copy of its reference (as every
    committed folder's was), every other row a script of its own."""
    copies = {c.row: c.reference for c, *_ in plan if c.kind == "same_as"}
    names = {n for c, *_ in plan for n in (c.row, c.reference)}
    return [{"name": n, "script": copies.get(n, n)} for n in names]


@pytest.mark.parametrize(
    "folder, stops",
    [("async-checkpoint-cpu-2core-avx512bf16-2026-11-27", True), ("cpu-2core-avx512bf16-2026-11-27", False)],
)
def test_the_floor_max_floor_judges_is_the_floor_the_folder_s_tables_print(folder, stops):
    """The decision --max-floor makes after each self pair (pairs.floor_now, then pairs.refusal) on two committed
    folders' own runs: the floor it reads is the one their floors.json (and table.md) give, ±26.3 % and ±2.6 %, so
    --max-floor 5 stops the first and not the second."""
    runs = pd.read_csv(RESULTS / folder / "runs.csv")
    plan = pairs.read_plan(pd.read_csv(RESULTS / folder / "pairs.csv"))
    floor = pairs.floor_now(runs, plan, _self_matrix(plan))
    assert floor == pytest.approx(floors.read_floors(RESULTS / folder)["floor"], rel=1e-9)
    assert (pairs.refusal(floor, 0.05) is not None) is stops
    assert pairs.refusal(floor, None) is None and pairs.refusal(None, 0.05) is None


def test_pairs_run_and_asked_say_where_the_gpu_run_stopped():
    """gpu-h200-2026-11-28 ran 26 of its 57 runs (timeout at 540 s): its self pair ran 1 of 3 pairs, read from
    pairs.csv (the plan) and runs.csv (what ran); a folder that ran its plan whole ran all of its rounds."""
    folder = RESULTS / "gpu-h200-2026-11-28"
    plan = pairs.read_plan(pd.read_csv(folder / "pairs.csv"))
    assert pairs.pairs_ran(pd.read_csv(folder / "runs.csv"), plan) == (3, 1)
    folder = RESULTS / "cpu-2core-avx512bf16-2026-11-27"  # re-runs of disturbed pairs add rounds: still 3 asked
    assert pairs.pairs_ran(pd.read_csv(folder / "runs.csv"), pairs.read_plan(pd.read_csv(folder / "pairs.csv"))) == (
        3,
        3,
    )


def _folder(tmp_path, name="f", floor=0.02, target_floor=None, comparisons=(), **keys):
    """A result folder holding floors.json (and a table.md whose printed floors disagree with it)."""
    folder = tmp_path / name
    folder.mkdir()
    record = floors.floors_record(floor, list(comparisons), "test", target_floor=target_floor, **keys)
    (folder / floors.FLOORS).write_text(floors.floors_text(record))
    printed = "Noise floor: ±50.0 %, ...\n\nTime to the target: its noise floor ±40.0 % (...)\n"
    (folder / "table.md").write_text(printed)
    return folder


def _comparison(row, ratio, verdict, floor, kind="rung_base", measure="rate", reference="A"):
    return {"row": row, "reference": reference, "kind": kind, "measure": measure, "ratio": ratio, "lo": ratio * 0.95,
            "hi": ratio * 1.05, "pairs": 3, "disturbed": 0, "verdict": verdict, "floor": floor}  # fmt: skip


def test_the_index_and_the_pages_read_the_floors_from_floors_json_never_from_markdown(tmp_path):
    """The folder's table.md prints ±50.0 % and ±40.0 %, its floors.json 0.02 and 0.037: results_index and pages read
    the JSON (they once took the Markdown's numbers back by regular expressions)."""
    folder = _folder(tmp_path, floor=0.02, target_floor=0.037)
    assert results_index.floor_pct(folder) == pytest.approx(2.0)
    assert results_index.target_floor_pct(folder) == pytest.approx(3.7)
    assert pages.target_floor_of(folder) == pytest.approx(0.037)
    assert pages.floor_of(folder) == pytest.approx(0.02)
    empty = tmp_path / "probe"
    empty.mkdir()
    (empty / "README.md").write_text("Noise floor: ±9.9 %\n")  # a study's page: its words are not data
    assert results_index.floor_pct(empty) is None and pages.target_floor_of(empty) is None


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("{not json", "floors.json"),
        ("[]", "not a JSON object"),
        ('{"format": 1, "floor": -1, "comparisons": []}', "floor is -1"),
        ('{"format": 1, "floor": 0.1, "comparisons": [{"row": 1}]}', "comparisons[0].row"),
        ('{"format": 1, "floor": 0.1, "pairs_run": 1.5, "comparisons": []}', "pairs_run"),
        ('{"format": 2, "floor": 0.1, "comparisons": []}', "format 2"),
    ],
)
def test_a_malformed_floors_json_is_one_line(tmp_path, text, fragment, capsys):
    """Bad bytes in floors.json: the index and the pages stop with one line naming the file and what is wrong, no
    traceback; and a bench folder (summary.csv) without floors.json names the command that writes it."""
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / floors.FLOORS).write_text(text)
    for read in (results_index.floor_pct, pages.target_floor_of, results_index.headline_of):
        with pytest.raises(SystemExit) as stop:
            read(folder)
        assert fragment in str(stop.value) and "\n" not in str(stop.value), stop.value
    (folder / floors.FLOORS).unlink()
    (folder / "summary.csv").write_text("config\nx\n")
    with pytest.raises(SystemExit, match="--floors-only --out"):
        results_index.floor_pct(folder)


def test_the_headline_is_the_largest_effect_the_floor_allows(tmp_path):
    """Of a folder's own comparisons (no self pair, no product down a ladder), the one farthest from 1.00× either
    way that is faster or slower, worded as the technique pages allow it: a 0.40× slowdown beats a 1.50× speed-up, a
    3.00× "faster" past a ±26 % floor gives no ratio (pages.allowed), a time to a target reads "sooner"."""
    found = [
        _comparison("B", 1.5, "faster", 0.03),
        _comparison("C", 0.4, "slower", 0.03),
        _comparison("D", 3.0, "faster", 0.26),
        _comparison("A, again", 0.2, "no measurable difference", 0.03, kind="same_as"),
        _comparison("E", 6.0, "faster", 0.03, kind="first_rung"),
    ]
    headline = results_index.headline_of(_folder(tmp_path, "a", comparisons=found))
    assert headline == "C against A: 0.40× slower (0.38–0.42)"
    sooner = [_comparison("B", 1.5, "faster", 0.03), _comparison("F", 2.15, "faster", 0.04, measure="time_to_target")]
    assert results_index.headline_of(_folder(tmp_path, "b", comparisons=sooner)) == (
        "F against A: 2.15× sooner to the target (2.04–2.26)"
    )
    noisy = [_comparison("D", 3.0, "faster", 0.26)]
    assert results_index.headline_of(_folder(tmp_path, "c", 0.26, comparisons=noisy)) == "no verdict (floor ±26 %)"
    none = [_comparison("B", 1.5, "no verdict: no noise floor", None)]
    assert results_index.headline_of(_folder(tmp_path, "d", None, comparisons=none)) == "no verdict (no noise floor)"
    within = [_comparison("B", 1.01, "no measurable difference", 0.03)]
    assert results_index.headline_of(_folder(tmp_path, "e", comparisons=within)) == "none beyond its floor"
    assert results_index.headline_of(_folder(tmp_path, "g")) == "–"


def test_runs_time_says_where_the_runs_stopped_early(tmp_path):
    folder = _folder(tmp_path, pairs_asked=3, pairs_run=1, stopped="interrupted (SIGTERM)")
    pd.DataFrame({"wall_s": [60.0, 33.0]}).to_csv(folder / "runs.csv", index=False)
    assert results_index.runs_time(folder) == "1 min 33 s; stopped after 1 of 3 pairs"
    whole = _folder(tmp_path, "whole", pairs_asked=3, pairs_run=3)
    pd.DataFrame({"wall_s": [60.0, 33.0]}).to_csv(whole / "runs.csv", index=False)
    assert results_index.runs_time(whole) == "1 min 33 s"


def _empty_tables(text: str) -> list[int]:
    """The lines of `text` that open a Markdown table (its |---| line) with no row under it."""
    lines = text.splitlines()
    return [n for n, line in enumerate(lines)
            if line.startswith("|---") and (n + 1 == len(lines) or not lines[n + 1].startswith("| "))]  # fmt: skip


def test_results_index_has_a_headline_column_says_where_a_run_stopped_and_no_empty_table(tmp_path, monkeypatch):
    """results/README.md: its Current table has a headline column (the first screen's folder: train_fast.py's GPT
    2.15× sooner to 1.70 than train.py's, the example of the issue that asked for it), the GPU folder that stopped
    after 1 of its 3 pairs says so, and no section is an empty table: with no topic, no older folder and no
    mutation table, each section says so in a sentence."""
    index = (RESULTS / "README.md").read_text()
    assert "| verdicts | headline | what |" in index
    line = next(x for x in index.splitlines() if "[`first-screen-cpu-2core-avx512bf16-2026-11-29/`]" in x)
    assert "2.15× sooner to the target (1.94–2.45)" in line
    line = next(x for x in index.splitlines() if "[`gpu-h200-2026-11-28/`]" in x)
    assert "stopped after 1 of 3 pairs" in line
    assert not _empty_tables(index)
    (tmp_path / "current.toml").write_text("topic = []\n")
    monkeypatch.setattr(results_index, "RESULTS", tmp_path)
    text = results_index.render()
    assert not _empty_tables(text), text
    assert "None: results/current.toml names no topic yet." in text and "None yet: `python tests/mutations.py`" in text
    assert _empty_tables("| a |\n|---|\n\nmore")  # the check finds one


def test_floors_only_writes_a_folder_s_floors_json_from_its_data_and_nothing_else(tmp_path):
    """`bench.py --floors-only` on a copy of gpu-h200-2026-11-28's summary.csv, pairs.csv, runs.csv and env.json
    writes the floors.json committed beside them (what results/README.md reads: no floor, 1 of 3 pairs) and no
    other file."""
    folder = tmp_path / "gpu"
    folder.mkdir()
    for name in ("summary.csv", "pairs.csv", "runs.csv", "env.json"):
        shutil.copy(RESULTS / "gpu-h200-2026-11-28" / name, folder / name)
    proc = run("bench/bench.py", "--out", folder, "--floors-only", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(p.name for p in folder.iterdir()) == [
        "env.json",
        "floors.json",
        "pairs.csv",
        "runs.csv",
        "summary.csv",
    ]
    assert floors.read_floors(folder) == floors.read_floors(RESULTS / "gpu-h200-2026-11-28")
    (folder / "summary.csv").unlink()
    proc = run("bench/bench.py", "--out", folder, "--floors-only", timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "--floors-only needs" in proc.stderr


def test_every_folder_with_comparisons_has_floors_json():
    """Every committed folder the bench wrote (summary.csv) or a study that measures pairs wrote has floors.json, of
    the shape floors.check_floors wants: the index reads no floor from Markdown, so a folder without it would lose
    its floor and verdicts."""
    for name in results_index.result_folders():
        folder = RESULTS / name
        if (folder / "summary.csv").is_file() or name.startswith(("nanogpt-to-target", "compile-cold-start")):
            assert floors.read_floors(folder) is not None, f"{name}/ has no floors.json: bench.py --floors-only"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
VALUE = st.none() | st.booleans() | st.integers(-3, 10**6) | st.floats(allow_nan=True) | st.text(max_size=6)
COMPARISON = st.fixed_dictionaries(
    {k: VALUE for k in ("ratio", "lo", "hi", "floor", "pairs", "disturbed")}
    | {k: st.text(max_size=6) | VALUE for k in ("row", "reference", "kind", "measure", "verdict")}
)
SHAPED = st.fixed_dictionaries(
    {"format": st.just(1) | VALUE, "comparisons": st.lists(COMPARISON, max_size=3) | VALUE}
    | {k: VALUE for k in ("floor", "target_floor", "max_floor", "pairs_asked", "pairs_run", "stopped")}
)

NUMBER = st.none() | st.floats(0, 1e6) | st.integers(0, 10)
VALID = st.fixed_dictionaries(
    {"format": st.just(1), "floor": NUMBER, "target_floor": NUMBER, "pairs_asked": st.none() | st.integers(0, 5),
     "pairs_run": st.none() | st.integers(0, 5), "stopped": st.none() | st.text(max_size=6),
     "comparisons": st.lists(st.fixed_dictionaries(
         {k: NUMBER for k in ("ratio", "lo", "hi", "floor")} | {"pairs": st.none() | st.integers(0, 5)}
         | {k: st.text(max_size=4) for k in ("row", "reference")}
         | {"kind": st.sampled_from(["rung_base", "same_as", "first_rung", "x"]),
            "measure": st.sampled_from(["rate", "time_to_target", "first_step", "y"]),
            "verdict": st.sampled_from(["faster", "slower", "no measurable difference", "disturbed", "no verdict: x"])}
     ), max_size=4)}
)  # fmt: skip


@settings(max_examples=150, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.binary(max_size=200)
    | JSON.map(json.dumps)
    | SHAPED.map(lambda r: json.dumps(r, allow_nan=True))
    | VALID.map(json.dumps)
)
def test_floors_json_of_any_bytes_is_read_or_refused_in_one_line(tmp_path_factory, data):
    """floors.json of any bytes, any JSON, or a record of its shape with any values: floors.read_floors returns it
    or raises ValueError (one line); the index's and the pages' readers then give their cell or stop with one line
    (SystemExit), never another exception."""
    folder = tmp_path_factory.mktemp("f")
    (folder / floors.FLOORS).write_bytes(data if isinstance(data, bytes) else data.encode())
    try:
        floors.read_floors(folder)
    except ValueError as error:
        assert "\n" not in str(error)
    for read in (results_index.floor_pct, results_index.verdicts_of, results_index.headline_of,
                 results_index.runs_time, pages.target_floor_of):  # fmt: skip
        try:
            read(folder)
        except SystemExit as stop:
            assert isinstance(stop.code, str) and "\n" not in stop.code and ": error: " in stop.code, stop.code

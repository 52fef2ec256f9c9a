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
    assert pairs.verdict([], floor) == "not measured"
    assert pairs.spread([1.4, 1.33, 1.37]) == (1.37, 1.33, 1.4)  # median, min, max
    assert pairs.noise_floor([0.978, 1.01, 0.963]) == pytest.approx(0.037)
    assert pairs.noise_floor([]) is None
    assert pairs.ratio_cell([1.33, 1.37, 1.42], floor) == "1.37× (1.33–1.42), faster"


def test_no_verdict_without_a_measured_floor_or_from_fewer_than_3_pairs():
    """The issue's own matrix: no self pair, one pair per comparison, and a copy of train.py called "slower" at
    0.99x. Now: no floor, no verdict; 2 pairs, no verdict; a floor needs 3 self pairs; a comparison whose disturbed
    pairs re-runs did not replace reads "disturbed"."""
    assert pairs.verdict([0.99], 0.0) == "no verdict: 1 pair, 3 needed"
    assert pairs.verdict([1.30, 1.35], 0.02) == "no verdict: 2 pairs, 3 needed"
    assert pairs.verdict([1.01, 1.02, 1.025], None) == "no verdict: no noise floor"
    assert pairs.noise_floor([1.01, 0.99]) is None  # two self pairs set no floor
    assert pairs.verdict([1.30, 1.35], 0.02, disturbed=1) == "disturbed"
    assert pairs.verdict([], 0.02, disturbed=3) == "disturbed"
    assert pairs.verdict([1.30, 1.35, 1.33], 0.02, disturbed=1) == "faster"  # re-runs replaced the disturbed pair
    # a floor wider than 15 %: within it no verdict (not "no measurable difference"); beyond it still a verdict
    assert pairs.verdict([1.09, 1.20, 1.32], 0.256) == "no verdict: noise floor ±26 %"
    assert pairs.verdict([0.17, 0.18, 0.20], 0.256) == "slower"


def test_a_matrix_without_a_self_pair_gets_one():
    matrix = [
        {"name": "T", "script": "src/train.py", "args": ["--seed", "1"], "ladder": "x"},
        {"name": "A", "script": "src/train_amp.py", "args": [], "rung_base": "T", "ladder": "x"},
    ]
    assert pairs.ensure_self_pair(matrix) == "T, again"
    assert matrix[0]["same_as"] == "T" and matrix[0]["args"] == ["--seed", "1"] and "ladder" not in matrix[0]
    assert pairs.is_self_pair(pairs.comparisons(matrix)[0], matrix)
    assert pairs.ensure_self_pair(matrix) is None  # one is enough
    assert pairs.ensure_self_pair([{"name": "T", "script": "s", "args": []}]) is None  # nothing to compare
    # --only that keeps a row but not what it is compared with: no comparison (it was a StopIteration traceback)
    alone = [{"name": "T, again", "script": "src/train.py", "args": [], "same_as": "T"}]
    assert pairs.comparisons(alone) == [] and pairs.ensure_self_pair(alone) is None


def _runs(rates: dict[int, float], spreads: dict[int, float] | None = None, config: dict[int, str] | None = None):
    """A runs.csv of jobs 0..n with the given rates (images/s, batch 100, so step_ms_blocked = 1e5 / rate)."""
    import pandas as pd

    return pd.DataFrame(
        [
            {
                "config": (config or {}).get(job, f"c{job % 2}"), "job": job, "status": "ok", "global_batch": 100,
                "images_per_s": rate, "step_ms_blocked": 1e5 / rate,
                "step_blocks_spread": (spreads or {}).get(job, 0.03),
            }
            for job, rate in rates.items()
        ]
    )  # fmt: skip


def test_a_pair_far_from_its_siblings_or_with_a_scattered_run_is_disturbed_and_re_run():
    """The busy machine of the issue: train_fast.py over its base gave pairs 1.19, 1.27, 7.83 and a verdict. Here
    the 7.83 pair is left out and re-run; a run whose blocks of steps scattered (another program took the cores for
    part of its window) marks its pair; a pair within its siblings' noise is kept."""
    c = Comparison("B", "A", "rung_base")
    plan = [(c, 0, 1, 0), (c, 1, 2, 3), (c, 2, 5, 4)]
    config = {0: "A", 1: "B", 2: "B", 3: "A", 4: "A", 5: "B"}
    runs = _runs({0: 1000, 1: 1190, 2: 1270, 3: 1000, 4: 1000, 5: 7830}, config=config)
    judged = pairs.assess(runs, plan)
    assert [bool(p.disturbed) for p in judged] == [False, False, True]
    assert "far from its siblings" in judged[2].disturbed
    assert pairs.pair_ratios(runs, plan)[c] == pytest.approx([1.19, 1.27])
    assert pairs.reruns_due(runs, plan, 3, {}, 2) == [(c, judged[2].disturbed)]
    assert pairs.reruns_due(runs, plan, 3, {c: 2}, 2) == []  # re-runs are bounded
    quiet = _runs({0: 1000, 1: 1190, 2: 1270, 3: 1000, 4: 1000, 5: 1230}, config=config)
    assert not any(p.disturbed for p in pairs.assess(quiet, plan))  # 1.19, 1.27, 1.23: siblings, kept
    scattered = _runs({0: 1000, 1: 1190, 2: 1270, 3: 1000, 4: 1000, 5: 1230}, spreads={3: 0.60}, config=config)
    assert "spread 60 %" in pairs.assess(scattered, plan)[1].disturbed  # its reference run (job 3) scattered


def test_a_program_that_took_the_cores_during_2_of_a_configuration_s_3_runs_marks_both():
    """The scatter rule judges a run against what its configuration's steps do undisturbed. Another program during 2
    of a configuration's 3 runs makes their median a disturbed run's; the steady third still sets the usual spread
    (at most twice its own), so both disturbed runs are found. A configuration whose steps scatter by nature (a
    DataLoader's refills: 10 %, 35 %, 30 %) is not flagged, nor are one configuration's quiet runs for another's."""
    config = {0: "A", 1: "A", 2: "A", 3: "B", 4: "B", 5: "B"}
    rates = {j: 1000 for j in range(6)}
    hog = pairs.scattered_runs(_runs(rates, spreads={0: 0.06, 1: 0.60, 2: 0.55}, config=config))
    assert sorted(hog) == [1, 2] and "spread 60 %" in hog[1]
    assert pairs.scattered_runs(_runs(rates, spreads={0: 0.10, 1: 0.35, 2: 0.30}, config=config)) == {}
    assert sorted(pairs.scattered_runs(_runs(rates, spreads={0: 0.05, 1: 0.06, 2: 0.50}, config=config))) == [2]
    assert pairs.scattered_runs(_runs(rates, spreads={0: 0.04, 3: 0.20, 4: 0.22, 5: 0.24}, config=config)) == {}
    # many runs: the steadiest third, not the steadiest one (a 10-run DDP row of 4.7 % to 28.9 %: none disturbed);
    # 2 runs: no run is judged against itself (a GPU row's 6 % and 47 %)
    ten = {j: 0.047 + 0.0269 * j for j in range(10)}
    assert pairs.scattered_runs(_runs({j: 1000 for j in range(10)}, spreads=ten, config=dict.fromkeys(range(10), "D"))) == {}
    assert pairs.scattered_runs(_runs({0: 1000, 1: 1000}, spreads={0: 0.06, 1: 0.47}, config={0: "G", 1: "G"})) == {}


def test_on_a_busy_machine_each_verdict_agrees_with_the_quiet_one_or_reads_disturbed():
    """The issue's busy-machine table, as pair ratios, against the quiet run's verdicts: every comparison that
    keeps a verdict after the disturbed pairs are left out agrees with the quiet run; the others read disturbed."""
    busy = {  # comparison: (busy pair ratios, quiet verdict)
        "channels_last float32": ([0.31, 4.02, 5.19], "faster"),
        "train_fast float32": ([1.19, 1.27, 7.83], "faster"),
        "resnet50 amp": ([0.29, 1.24, 1.25], "faster"),
    }
    floor = 0.05
    for name, (ratios, quiet) in busy.items():
        c = Comparison(name, "base", "rung_base")
        plan = [(c, r, 2 * r + 1, 2 * r) for r in range(3)]
        runs = _runs({j: (1000 * ratios[j // 2] if j % 2 else 1000) for j in range(6)})
        kept, left_out = pairs.pair_ratios(runs, plan)[c], pairs.disturbed_counts(runs, plan)[c]
        judged = pairs.verdict(kept, floor, left_out)
        assert left_out == 1 and judged in (quiet, "disturbed"), (name, kept, judged)
        assert judged == "disturbed"  # 2 pairs left until a re-run replaces the third


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
    runs once a round: n runs for n rungs, not 2(n - 1)); the self pair's two runs serve no other comparison."""
    found = pairs.comparisons(LADDER)
    assert [(c.row, c.reference, c.kind) for c in found] == [
        ("T again", "T", "same_as"), ("A", "T", "rung_base"), ("C", "A", "rung_base"), ("L", "C", "rung_base")
    ]  # fmt: skip
    jobs, plan = pairs.schedule(found, 3)
    assert [j.index for j in jobs] == list(range(len(jobs)))
    for r in range(3):
        assert [j.config for j in jobs if j.round == r].count("A") == 1  # a rung once a round
    # the self pair has runs of its own: T's copy never sits beside a heavier rung that T's run also serves
    assert [j.config for j in jobs if j.round == 0] == ["T", "T again", "T", "A", "C", "L"]
    assert [j.config for j in jobs if j.round == 1] == ["L", "C", "A", "T", "T again", "T"]  # round 0 backwards
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
    matrix[4]["paired"] = False  # `paired = false`: the row runs once, outside the pairs, its comparison left out
    jobs, plan = pairs.plan(matrix, 2, skipped=set())
    assert {c.row for c, *_ in plan} == {"w1", "w2", "dp"} and [j.round for j in jobs if j.config == "ac"] == [-1]


def test_every_result_folder_names_a_commit_of_this_repository():
    """results/ lists only folders whose env.json (or provenance.json, a recorded correction) names a commit in
    this repository's history (a folder made elsewhere or before provenance goes under results/archive/, with a
    line in its README)."""
    # the folders git tracks: `bash run_all.sh` writes its own (results/local/, or --out results/mine) beside them
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "results"], capture_output=True, text=True).stdout
    names = {line.split("/")[1] for line in tracked.splitlines() if line.count("/") >= 2}
    folders = [REPO / "results" / name for name in sorted(names) if name not in ("archive", "mutations")]
    folders += sorted(p for p in (REPO / "results" / "mutations").iterdir() if p.is_dir())  # the mutation tables
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


def test_a_ladder_product_stops_at_a_link_without_undisturbed_pairs_and_nothing_run_is_no_crash():
    """A rung whose every pair was disturbed has no ratio: the rungs above it get no product over the first rung
    (it would be over an intermediate rung, under the first rung's name), and say why; a bench whose every row was
    skipped has no rate to compare (no crash in the re-run check)."""
    import pandas as pd
    import summary

    frame = pd.DataFrame({"config": ["T", "A", "C"]})
    a, c = Comparison("A", "T", "rung_base"), Comparison("C", "A", "rung_base")
    summary.add_comparisons(frame, {a: [], c: [1.30, 1.35, 1.40]}, 0.05, {a: 3})
    assert frame.loc[1, "speedup_rung_verdict"] == "disturbed" and frame.loc[2, "speedup_rung_verdict"] == "faster"
    assert pd.isna(frame.loc[2, "speedup"]) and frame.loc[2, "speedup_verdict"] == "disturbed"
    skipped = pd.DataFrame([{"config": "T", "repeat": 1, "status": "skipped", "reason": "needs a GPU"}])
    assert pairs.run_speeds(skipped) == {} and pairs.reruns_due(skipped, [], 3, {}, 2) == []


def test_rows_that_differ_only_in_their_environment_are_not_a_self_pair():
    """An allocator or thread-count row runs the default row's script and arguments with another `env`: it is a
    comparison, not a copy, and its ratios must not set the noise floor (a 0.58x thread row once set it to ±46 %)."""
    base = {"name": "default", "script": "src/train.py", "args": [], "memory": "m", "baseline": "default"}
    copy = {**base, "name": "again", "same_as": "default"}
    threads = {**base, "name": "1 thread", "env": {"OMP_NUM_THREADS": "1"}}
    matrix = [base, copy, threads]
    found = {c.row: c for c in pairs.comparisons(matrix)}
    assert pairs.is_self_pair(found["again"], matrix) and not pairs.is_self_pair(found["1 thread"], matrix)


def test_runs_of_varying_length_compare_by_real_tokens_per_second_not_by_samples_per_step():
    """A fixed-length run is compared by global batch x 1000 / its median block's step time (samples/s, robust to a
    few seconds of load); a train_varlen.py run (pad_share recorded) by its real tokens/s over the whole window: a
    bucketed step of short speeches and a padded step of 16 full-width ones are not the same work."""
    import pandas as pd

    runs = pd.DataFrame(
        [
            {"job": 0, "status": "ok", "images_per_s": 40.0, "global_batch": 16, "step_ms_blocked": 400.0,
             "pad_share": None, "tokens_per_s": 10_240.0},
            {"job": 1, "status": "ok", "images_per_s": 40.0, "global_batch": 16, "step_ms_blocked": 400.0,
             "pad_share": 0.56, "tokens_per_s": 4_400.0},
            {"job": 2, "status": "ok", "images_per_s": 90.0, "global_batch": 16, "step_ms_blocked": 150.0,
             "pad_share": 0.01, "tokens_per_s": 9_800.0},
        ]
    )  # fmt: skip
    assert pairs.run_speeds(runs) == {0: 40.0, 1: 4_400.0, 2: 9_800.0}


def test_runs_to_a_target_compare_their_times_to_it_in_the_same_pairs_beside_their_rates():
    """A run to --target-loss gives two ratios from the same pair: its rate's (as any run's) and its time to the
    target's, the reference's seconds over the row's (× sooner); a run that never reached the target gives no time
    ratio, and the summary's x_target holds the median, spread and verdict of the time ratios."""
    import pandas as pd
    from summary import add_target

    runs = pd.DataFrame(
        [
            {"job": j, "status": "ok", "images_per_s": 16e3 / ms, "global_batch": 16, "step_ms_blocked": ms,
             "time_to_target_s": t}
            for j, (ms, t) in enumerate([(1000, 200.0), (1250, 125.0), (1250, 130.0), (1000, 210.0),
                                         (1000, 190.0), (1250, None)])
        ]
    )  # fmt: skip
    c = Comparison("muon", "adamw", "rung_base")
    plan = [(c, 0, 1, 0), (c, 1, 2, 3), (c, 2, 5, 4)]
    assert pairs.pair_ratios(runs, plan)[c] == [0.8, 0.8, 0.8]  # Muon's steps are slower...
    sooner = pairs.pair_ratios(runs, plan, to_target=True)[c]
    assert sooner == pytest.approx([200 / 125, 210 / 130])  # ...and it gets there sooner; the third never got there
    summary = pd.DataFrame({"config": ["adamw", "muon"]})
    add_target(summary, {c: [1.6, 1.62, 1.58]}, 0.05, {c: 0})
    row = summary.iloc[1]
    assert (row.x_target, row.x_target_lo, row.x_target_hi, row.x_target_verdict) == (1.6, 1.58, 1.62, "faster")
    assert pd.isna(summary.iloc[0].x_target)

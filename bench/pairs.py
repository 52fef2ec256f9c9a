"""Interleaved pairs: every row measured against another runs next to it, in alternating order, and each pair of
adjacent runs gives one ratio; a comparison is the median of its pair ratios, their spread, and a verdict.

Why: two runs of the same script minutes apart on a shared machine differ by more than many techniques are worth
(train_fast.py measured 0.83x and 1.22x its base in two single runs). Runs next to each other share the machine's
state; alternating the order (A B, then B A) cancels what drifts and what favours the first or second run of a pair.

- `comparisons(matrix)`: which row is measured against which (a copy of itself, its rung's base, the whole
  configuration an ablation leaves a change out of, its ceiling, the first row of its memory table, the previous
  point of its sweep).
- `schedule(...)`: the runs in order, round by round, and which two runs make each pair.
- `summarise_pairs(...)`: per comparison, the pair ratios' median, min-max and verdict against the noise floor, which
  the profile's self pair (a row compared with a copy of itself) measures; `floor_now` and `refusal`: that floor
  while the runs go on, and --max-floor's verdict on it.
- `pairs_ran`: the rounds asked and run (floors.json's, bench/floors.py).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

# The relations that make a comparison, in the order a row's comparisons are listed: (key, what the ratio is called)
KINDS = {
    "same_as": "over a copy of itself (the noise floor)",
    "rung_base": "over its base",
    "ablation_of": "over the whole",
    "ceiling": "of its ceiling",
    "memory": "over the table's first row",
    "sweep": "over the sweep's previous point",
}


@dataclass(frozen=True)
class Comparison:
    """`row`'s images/s over `reference`'s, for the relation `kind` (a KINDS key)."""

    row: str
    reference: str
    kind: str


def _names(value) -> list[str]:
    return [value] if isinstance(value, str) else list(value or [])


def comparisons(matrix: list[dict]) -> list[Comparison]:
    """Every comparison the matrix declares, in matrix order: a row's `same_as` (a copy of another row: the self pair
    that measures the noise floor), `rung_base`, `ablation_of` and `ceiling`, and for
    a row of a memory table or a sweep that is not its first, that table's or sweep's first row (matrix order). A row
    is never compared with itself; a self pair is a row whose reference is a copy of it (same script and arguments)."""
    found, first, names = [], {}, {run["name"] for run in matrix}
    for run in matrix:
        for kind in ("same_as", "rung_base", "ablation_of", "ceiling"):  # a row --only left out compares nothing
            if run.get(kind) and run[kind] != run["name"] and run[kind] in names:
                found.append(Comparison(run["name"], run[kind], kind))
        for group in _names(run.get("memory")):  # each row against the table's first (its reference)
            head = first.setdefault(("memory", group), run["name"])
            if head != run["name"]:
                found.append(Comparison(run["name"], head, "memory"))
        for group in _names(run.get("sweep")):  # each point against the one before it: a chain, as a ladder
            previous = first.get(("sweep", group))
            first[("sweep", group)] = run["name"]
            if previous is not None:
                found.append(Comparison(run["name"], previous, "sweep"))
    return list(dict.fromkeys(found))  # a relation declared twice counts once


@dataclass(frozen=True)
class Job:
    """One run of the schedule: `config` (a row's name), its `round` (0-based) and its position in the whole order."""

    config: str
    round: int
    index: int


def schedule(comparisons_: list[Comparison], rounds: int) -> tuple[list[Job], list[tuple[Comparison, int, int, int]]]:
    """The paired runs in order and the pairs they make: (jobs, [(comparison, round, row job index, reference job
    index)]).

    Round 0 lists every comparison's two runs next to each other, in matrix order. Where a comparison shares a
    configuration with the run before it, that run serves both (a ladder: the rung that is one comparison's row is
    the next one's reference); otherwise its two runs are ordered so that the second is the one the next comparison
    shares (a star of comparisons around one reference: row, reference, then the next row). So a ladder of n rungs
    costs n runs a round, not 2(n - 1). A self pair (kind "same_as") shares no run with another comparison: its two
    runs are its own, so the noise floor measures two runs of one configuration in the same surroundings, not a
    ladder's base run beside heavier rungs and its copy beside nothing (in the cpu profile that sharing made the copy
    the faster run in 9 self pairs of 9). Round 1 is round 0 backwards, round 2 round 0 again, and so on: every pair's
    two runs are adjacent in every round, and their order alternates (A B, then B A), so an order effect cancels.
    """
    order: list[str] = []  # round 0's configurations
    placed: list[tuple[Comparison, int, int]] = []  # (comparison, position of its row, of its reference)
    alone = False  # the run before is a self pair's: no other comparison shares it
    for i, c in enumerate(comparisons_):
        if order and not alone and c.kind != "same_as" and order[-1] in (c.row, c.reference):  # share the run before
            first = order[-1]
        else:
            after = comparisons_[i + 1] if i + 1 < len(comparisons_) and c.kind != "same_as" else None
            shared = {after.row, after.reference} if after else set()
            first = c.row if c.reference in shared and c.row not in shared else c.reference
            order.append(first)
        second = c.reference if first == c.row else c.row
        order.append(second)
        alone = c.kind == "same_as"
        at = {first: len(order) - 2, second: len(order) - 1}
        placed.append((c, at[c.row], at[c.reference]))
    jobs, pairs = [], []
    for r in range(rounds):
        start, n = len(jobs), len(order)
        sequence = order if r % 2 == 0 else order[::-1]
        jobs += [Job(config, r, start + k) for k, config in enumerate(sequence)]
        for c, row, reference in placed:
            if r % 2:  # backwards: position k is now n - 1 - k
                row, reference = n - 1 - row, n - 1 - reference
            pairs.append((c, r, start + row, start + reference))
    return jobs, pairs


def spread(ratios: list[float]) -> tuple[float, float, float] | None:
    """(median, min, max) of the pair ratios; None without any. The spread is the min-max range over the pairs (with 3
    to 5 pairs, every pair counts: no interval estimate would be more honest)."""
    if not ratios:
        return None
    return statistics.median(ratios), min(ratios), max(ratios)


MIN_PAIRS = 3  # no verdict from fewer pairs, and no noise floor from fewer self pairs
OUTLIER_MADS = 4.0  # a pair whose log ratio lies more than this many median absolute deviations from its
OUTLIER_MIN = 0.15  # comparison's median, and more than 15 % from it, lies far from its siblings: re-run
SCATTER_TIMES = 3.0  # a run whose blocks spread (step_blocks_spread) more than 3 times its configuration's median
SCATTER_MIN = 0.25  # spread, and more than 25 %, was disturbed within its window: its pairs are re-run
STEADIEST_TIMES = 2.0  # the usual spread: the configuration's median, at most twice its steadiest third's
NOISY_FLOOR = 0.15  # a floor wider than +-15 %: within it "no verdict: noise floor ...", not "no difference"
RERUN_SHARE = 8  # re-runs take at most one pair in 8 of the plan's (at least 2): a bounded cost


def noise_floor(self_ratios: list[float]) -> float | None:
    """How far from 1.0 a ratio of a configuration to itself strayed: max |ratio - 1| over the self pairs' ratios,
    those `assess` found undisturbed (a pair far from its siblings is re-run and left out, so one disturbed pair
    cannot set the floor). None from fewer than MIN_PAIRS ratios: a floor needs at least 3 pairs. A ratio within
    1 +- floor is what measuring the same code twice gives."""
    return max(abs(r - 1) for r in self_ratios) if len(self_ratios) >= MIN_PAIRS else None


def verdict(
    ratios: list[float], floor: float | None, disturbed: int = 0, pairs: int | None = None, refused: str | None = None
) -> str:
    """The verdict of a comparison from its undisturbed pair ratios `ratios`: "faster" when every one is above 1 +
    floor, "slower" when every one is below 1 - floor, else "no measurable difference" (the pairs disagree, or
    straddle 1 within the noise). No verdict from fewer than MIN_PAIRS pairs (`pairs`, default len(ratios)): then
    "disturbed" when `disturbed` pairs were left out and re-runs did not replace them, else "no verdict: N pair(s),
    3 needed"; none without a noise floor (`floor` None): "no verdict: no noise floor"; none where the bench refused
    verdicts (`refused`, `refusal`'s words: a floor past --max-floor): "no verdict: <refused>". Where the floor is
    wider than NOISY_FLOOR, pairs within it read "no verdict: noise floor ±N %", not "no measurable difference" (a
    copy of one run strayed that far: these windows cannot resolve a smaller effect on this machine, and "no
    difference" would read as a finding); pairs all beyond it are still faster or slower.
    "not measured" without any ratio."""
    n = len(ratios) if pairs is None else pairs
    if not ratios:
        return "disturbed" if disturbed else "not measured"
    if n < MIN_PAIRS:
        return "disturbed" if disturbed else f"no verdict: {n} pair{'s' * (n != 1)}, {MIN_PAIRS} needed"
    if floor is None:
        return "no verdict: no noise floor"
    if refused:
        return f"no verdict: {refused}"
    if min(ratios) > 1 + floor:
        return "faster"
    if max(ratios) < 1 - floor:
        return "slower"
    if floor > NOISY_FLOOR:  # a copy of the same run strayed this far: "no measurable difference" would mislead
        return f"no verdict: noise floor ±{100 * floor:.0f} %"
    return "no measurable difference"


def ratio_cell(ratios: list[float], floor: float | None, short: bool = False) -> str:
    """A table cell: "1.37× (1.33–1.42), faster"; one pair: "1.37× (1 pair)"; none: "–"."""
    s = spread(ratios)
    if s is None:
        return "–"
    median, lo, hi = s
    text = f"{median:.2f}×" + (f" ({lo:.2f}–{hi:.2f})" if len(ratios) > 1 else " (1 pair)")
    return text if short else f"{text}, {verdict(ratios, floor)}"


def refusal(floor: float | None, max_floor: float | None) -> str | None:
    """Why the bench gives no verdict when the noise floor `floor` (a fraction) is past `max_floor` (--max-floor, a
    fraction): "noise floor ±N % past --max-floor M %"; None where either is None or the floor is within it."""
    if floor is None or max_floor is None or floor <= max_floor:
        return None
    return f"noise floor ±{100 * floor:.1f} % past --max-floor {100 * max_floor:g} %"


def too_busy(floor: float, max_floor: float) -> str:
    """The bench's line where the noise floor `floor` is past --max-floor `max_floor` (fractions)."""
    past = f"noise floor ±{100 * floor:.1f} % is past --max-floor {100 * max_floor:g} %"
    return f"{past}: this host is too busy for verdicts"


def floor_now(runs, plan: list[tuple[Comparison, int, int, int]], matrix: list[dict]) -> float | None:
    """The noise floor (a fraction) the self pairs of `plan` give from the runs that have finished (`runs`, runs.csv's
    rows so far): `noise_floor` of their undisturbed ratios (`pair_ratios`), what the tables will print for the same
    runs. None until 3 undisturbed self pairs have run."""
    mine = [p for p in plan if is_self_pair(p[0], matrix)]
    return noise_floor([r for ratios in pair_ratios(runs, mine).values() for r in ratios]) if mine else None


def is_self_pair(comparison: Comparison, matrix: list[dict]) -> bool:
    """Whether the comparison's row is a copy of its reference (same script, arguments and environment variables):
    the noise floor's pair. Rows that differ only in `env` (a thread count, an allocator) or in how they start
    (`fresh`: a fresh interpreter against a child of the bench's fork server) are not copies."""
    rows = {run["name"]: run for run in matrix}
    row, reference = rows.get(comparison.row), rows.get(comparison.reference)
    same = ("script", "args", "env", "fresh")
    return bool(row and reference) and all(row.get(key) == reference.get(key) for key in same)


def target_speeds(runs) -> dict[int, float]:
    """1 / the training seconds to the target (`time_to_target_s`, compilation out) of each finished run that reached
    one, by job index: a pair of them gives the reference's time to the target over the row's, "× sooner" (a run to
    --target-loss or --target-acc; a run that never reached its target has none, and its pairs no ratio)."""
    import pandas as pd

    if "job" not in runs or "status" not in runs or "time_to_target_s" not in runs:
        return {}
    seconds = pd.to_numeric(runs["time_to_target_s"], errors="coerce")
    return {
        int(job): 1.0 / s
        for job, status, s in zip(runs.job, runs.status, seconds, strict=True)
        if status == "ok" and pd.notna(job) and pd.notna(s) and s > 0
    }


def run_speeds(runs, blocked: bool = True) -> dict[int, float]:
    """The rate of each finished, measured run of `runs` (runs.csv), by job index, that pairs compare: global batch x
    1000 / `step_ms_blocked` (images/s of the median block of steps, see common.meter.blocked), which seconds of
    another program's load in one block do not move; images/s over the whole window where a run has no blocked
    step time (a folder from before it), or with `blocked` False. `assess` compares a pair by one measure: the
    whole window's for both runs where one has no blocked rate. A run of batches of varying length (train_varlen.py,
    which records pad_share) is compared by its real tokens/s over the whole window: its steps differ in width, so
    no block of them stands for the window, and a step's samples are not its work."""
    import pandas as pd

    def column(name):
        return pd.to_numeric(runs[name], errors="coerce") if name in runs else pd.Series([None] * len(runs))

    speeds = {}
    if "job" not in runs or "status" not in runs:  # nothing ran (every row skipped)
        return speeds
    by_block = blocked
    for job, status, ips, batch, step, pads, tokens in zip(
        runs.job, runs.status, column("images_per_s"), column("global_batch"), column("step_ms_blocked"),
        column("pad_share"), column("tokens_per_s"), strict=True
    ):  # fmt: skip
        if status != "ok" or pd.isna(job) or pd.isna(ips) or ips <= 0:
            continue
        if pd.notna(pads) and pd.notna(tokens):  # varying lengths: real tokens/s
            speeds[int(job)] = tokens
            continue
        use = by_block and pd.notna(batch) and pd.notna(step) and step > 0 and batch > 0
        speeds[int(job)] = 1e3 * batch / step if use else ips
    return speeds


def scattered_runs(runs) -> dict[int, str]:
    """The runs (job index -> why) whose steps scattered far beyond what their configuration's steps do undisturbed:
    a step_blocks_spread over SCATTER_TIMES x the configuration's usual spread and over SCATTER_MIN (another program
    took the cores during part of the window). The usual spread is the median of the configuration's runs, but with
    3 runs or more at most STEADIEST_TIMES x the steadiest third's (of 3 runs the steadiest; of 10 the third
    steadiest): where another program took 2 of a configuration's 3 runs, the median is a disturbed run's, and the
    steady run still says what the steps do alone. With 1 or 2 runs, the median."""
    import pandas as pd

    if "step_blocks_spread" not in runs or "job" not in runs:
        return {}
    ok = runs[(runs.status == "ok") & runs.job.notna()]
    spreads = pd.to_numeric(ok.step_blocks_spread, errors="coerce")
    found = {}
    for config, group in spreads.groupby(ok.config):
        values = sorted(group.dropna())
        usual = group.median()
        if len(values) >= 3:  # most runs disturbed: the steady third still says what the steps do alone
            usual = min(usual, STEADIEST_TIMES * values[len(values) // 3 - 1])
        for index, value in group.items():
            if pd.notna(value) and value > max(SCATTER_TIMES * usual, SCATTER_MIN):
                found[int(ok.job[index])] = (
                    f"a run's blocks of steps spread {100 * value:.0f} % "
                    f"(its configuration's runs: {100 * usual:.0f} %)"
                )
    return found


@dataclass(frozen=True)
class Pair:
    """One pair of a plan, judged: its `ratio` (None where a run failed or was not measured) and `disturbed`, why it
    is left out ("" when it is not)."""

    comparison: Comparison
    round: int
    row_job: int
    reference_job: int
    ratio: float | None
    disturbed: str


def assess(runs, plan: list[tuple[Comparison, int, int, int]], to_target: bool = False) -> list[Pair]:
    """Every pair of `plan` with its ratio (`run_speeds`: the row's rate over its adjacent reference run's) and
    whether it is disturbed: one of its runs scattered (`scattered_runs`), or its ratio lies far from its siblings
    (the comparison's other undisturbed pairs): farther than OUTLIER_MADS median absolute deviations of the log
    ratios from their median and more than OUTLIER_MIN from it. The median and its deviation come from all of the
    comparison's pairs, so with 3 pairs one far pair is found whatever side it is on. `to_target`: the pairs' ratios
    of time to the target instead (`target_speeds`), judged the same way."""
    import math

    speed, scattered, window = run_speeds(runs), scattered_runs(runs), run_speeds(runs, blocked=False)
    if to_target:
        speed = window = target_speeds(runs)
    judged = []
    for c, r, a, b in plan:
        ratio = speed[a] / speed[b] if a in speed and b in speed else None
        if ratio is not None and (speed[a] == window.get(a)) != (speed[b] == window.get(b)):
            ratio = window[a] / window[b]  # one run without a blocked rate: both by their whole window
        judged.append([c, r, a, b, ratio, scattered.get(a) or scattered.get(b) or ""])
    for c in dict.fromkeys(p[0] for p in judged):
        mine = [p for p in judged if p[0] == c and p[4] is not None and not p[5]]
        if len(mine) < 3:
            continue
        logs = [math.log(p[4]) for p in mine]
        middle = statistics.median(logs)
        limit = max(OUTLIER_MADS * statistics.median(abs(x - middle) for x in logs), math.log1p(OUTLIER_MIN))
        for p, x in zip(mine, logs, strict=True):
            if abs(x - middle) > limit:
                p[5] = f"{p[4]:.2f}× lies far from its siblings' median {math.exp(middle):.2f}×"
    return [Pair(*p) for p in judged]


def pair_ratios(
    runs, plan: list[tuple[Comparison, int, int, int]], to_target: bool = False
) -> dict[Comparison, list[float]]:
    """Each comparison's undisturbed pair ratios (`assess`; `to_target`: of time to the target), in plan order. A pair
    where either run failed or was not measured, or that is disturbed, is left out (so a comparison may have fewer
    ratios than rounds, or none)."""
    ratios: dict[Comparison, list[float]] = {}
    for p in assess(runs, plan, to_target):
        found = ratios.setdefault(p.comparison, [])
        if p.ratio is not None and not p.disturbed:
            found.append(p.ratio)
    return ratios


def disturbed_counts(
    runs, plan: list[tuple[Comparison, int, int, int]], to_target: bool = False
) -> dict[Comparison, int]:
    """How many of each comparison's pairs `assess` left out as disturbed."""
    counts: dict[Comparison, int] = {}
    for p in assess(runs, plan, to_target):
        counts[p.comparison] = counts.get(p.comparison, 0) + bool(p.disturbed)
    return counts


def reruns_due(
    runs, plan: list[tuple[Comparison, int, int, int]], rounds: int, done: dict[Comparison, int], most: int
) -> list[tuple[Comparison, str]]:
    """The comparisons to re-run one pair of now, with why: those with a disturbed pair and fewer undisturbed pairs
    than `rounds`, that have had fewer than `most` re-runs (`done`, per comparison), while all re-runs together stay
    within one pair in RERUN_SHARE of the plan's (at least 2). A failed run is not re-run."""
    due, seen = [], set()
    judged = assess(runs, plan)
    planned = len(plan) - sum(done.values())  # the plan's pairs before any re-run
    left = max(2, planned // RERUN_SHARE) - sum(done.values())
    for p in judged:
        c = p.comparison
        if c in seen or not p.disturbed or done.get(c, 0) >= most:
            continue
        good = sum(1 for q in judged if q.comparison == c and q.ratio is not None and not q.disturbed)
        if good < rounds and len(due) < left:
            seen.add(c)
            due.append((c, p.disturbed))
    return due


def ensure_self_pair(matrix: list[dict]) -> str | None:
    """Add a self pair to a matrix that compares rows but has none: a copy of the first comparison's reference,
    named "<reference>, again", in front (its pairs' spread is the noise floor a verdict needs). Returns the added
    row's name, or None when the matrix has a self pair or no comparison."""
    found = comparisons(matrix)
    if not found or any(is_self_pair(c, matrix) for c in found):
        return None
    reference = next(run for run in matrix if run["name"] == found[0].reference)
    copy = {
        **{k: v for k, v in reference.items() if k not in {"ladder", "rung_base", "memory", "sweep", "knob", "ceiling",
                                                         "ablation_of"}},
        "name": f"{reference['name']}, again",
        "same_as": reference["name"],
        "note": "the self pair the bench added (the matrix had none): its spread is the noise floor",
    }  # fmt: skip
    matrix.insert(0, copy)
    return copy["name"]


def plan(
    matrix: list[dict], rounds: int, skipped: set[str]
) -> tuple[list[Job], list[tuple[Comparison, int, int, int]]]:
    """Every run of a bench, in order: the paired rounds (`schedule` of the comparisons whose two rows both run here,
    `skipped` naming the rows this machine cannot run), then each row in no comparison, `repeats` times, in matrix
    order (round -1): a row with `paired = false` (a memory table whose lesson is memory, not speed) runs so,
    without its comparisons. Returns (jobs, pairs) as `schedule`."""
    alone = skipped | {run["name"] for run in matrix if run.get("paired") is False}  # `paired = false`: no pairs
    compared = [c for c in comparisons(matrix) if c.row not in alone and c.reference not in alone]
    jobs, pairs = schedule(compared, rounds)
    paired = {job.config for job in jobs}
    for run in matrix:
        if run["name"] not in paired and run["name"] not in skipped:
            jobs += [Job(run["name"], -1, len(jobs) + k) for k in range(run.get("repeats", 1))]
    return jobs, pairs


def plan_table(pairs: list[tuple[Comparison, int, int, int]], runs=None):
    """The pairs as a DataFrame (pairs.csv): row, reference, kind, round, row_job, reference_job, and with `runs`
    (runs.csv) each run's rate (`run_speeds`), the pair's ratio (empty where a run failed or was not measured) and
    `disturbed`, why `assess` left the pair out (empty when it counts)."""
    import pandas as pd

    speed = run_speeds(runs) if runs is not None else {}
    judged = {}
    if runs is not None:
        judged = {(p.comparison, p.round, p.row_job, p.reference_job): p for p in assess(runs, pairs)}
    return pd.DataFrame(
        [
            {
                "row": c.row, "reference": c.reference, "kind": c.kind, "round": r, "row_job": a, "reference_job": b,
                "row_images_per_s": speed.get(a), "reference_images_per_s": speed.get(b),
                "ratio": judged[(c, r, a, b)].ratio if (c, r, a, b) in judged else None,
                "disturbed": judged[(c, r, a, b)].disturbed if (c, r, a, b) in judged else "",
            }
            for c, r, a, b in pairs
        ],
        columns=["row", "reference", "kind", "round", "row_job", "reference_job", "row_images_per_s",
                 "reference_images_per_s", "ratio", "disturbed"],
    )  # fmt: skip


def read_plan(table) -> list[tuple[Comparison, int, int, int]]:
    """`plan_table`'s inverse: the pairs of a pairs.csv."""
    return [
        (Comparison(r.row, r.reference, r.kind), int(r.round), int(r.row_job), int(r.reference_job))
        for r in table.itertuples()
    ]


def pairs_ran(
    runs, plan: list[tuple[Comparison, int, int, int]], asked: int | None = None
) -> tuple[int | None, int | None]:
    """(asked, ran): the interleaved rounds the bench planned (`asked`, default: the rounds of `plan` in which every
    comparison has a pair, counted from round 0: a re-run of a disturbed pair adds a round of fewer comparisons) and
    the fewest pairs of those rounds that any comparison ran (both of its runs have a row in `runs`, runs.csv, that
    was not interrupted; ok or failed alike): below `asked` where the bench stopped before its plan's end (a
    timeout, Ctrl-C, --max-floor). (None, None) for a plan without pairs."""
    if not plan:
        return None, None
    compared = list(dict.fromkeys(c for c, *_ in plan))
    if asked is None:
        by_round: dict[int, set] = {}
        for c, r, _, _ in plan:
            by_round.setdefault(r, set()).add(c)
        asked = 0
        while by_round.get(asked) == set(compared):
            asked += 1
    done = set()
    if runs is not None and "job" in runs and "status" in runs:
        finished = runs[runs.job.notna() & runs.status.notna() & (runs.status != "interrupted")]
        done = {int(j) for j in finished.job}
    ran = {c: 0 for c in compared}
    for c, r, a, b in plan:
        if 0 <= r < asked and a in done and b in done:
            ran[c] += 1
    return asked, min(ran.values())

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
  the profile's self pair (a row compared with a copy of itself) measures.
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
    found, first = [], {}
    for run in matrix:
        for kind in ("same_as", "rung_base", "ablation_of", "ceiling"):
            if run.get(kind) and run[kind] != run["name"]:
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
    costs n runs a round, not 2(n - 1). Round 1 is round 0 backwards, round 2 round 0 again, and so on: every pair's
    two runs are adjacent in every round, and their order alternates (A B, then B A), so an order effect cancels.
    """
    order: list[str] = []  # round 0's configurations
    placed: list[tuple[Comparison, int, int]] = []  # (comparison, position of its row, of its reference)
    for i, c in enumerate(comparisons_):
        if order and order[-1] in (c.row, c.reference):  # share the run before it
            first = order[-1]
        else:
            after = comparisons_[i + 1] if i + 1 < len(comparisons_) else None
            shared = {after.row, after.reference} if after else set()
            first = c.row if c.reference in shared and c.row not in shared else c.reference
            order.append(first)
        second = c.reference if first == c.row else c.row
        order.append(second)
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


def noise_floor(self_ratios: list[float]) -> float | None:
    """How far from 1.0 a ratio of a configuration to itself strayed: max |ratio - 1| over the self pairs' ratios
    (None without a self pair). A ratio within 1 +- floor is what measuring the same code twice gives."""
    return max(abs(r - 1) for r in self_ratios) if self_ratios else None


def verdict(ratios: list[float], floor: float | None) -> str:
    """ "faster" when every pair's ratio is above 1 + floor, "slower" when every one is below 1 - floor, else "no
    measurable difference" (the pairs disagree, or straddle 1 within the noise). Without a measured floor, 0: the
    pairs must only agree on their side of 1. "not measured" without any ratio."""
    if not ratios:
        return "not measured"
    margin = floor or 0.0
    if min(ratios) > 1 + margin:
        return "faster"
    if max(ratios) < 1 - margin:
        return "slower"
    return "no measurable difference"


def ratio_cell(ratios: list[float], floor: float | None, short: bool = False) -> str:
    """A table cell: "1.37× (1.33–1.42), faster"; one pair: "1.37× (1 pair)"; none: "–"."""
    s = spread(ratios)
    if s is None:
        return "–"
    median, lo, hi = s
    text = f"{median:.2f}×" + (f" ({lo:.2f}–{hi:.2f})" if len(ratios) > 1 else " (1 pair)")
    return text if short else f"{text}, {verdict(ratios, floor)}"


def is_self_pair(comparison: Comparison, matrix: list[dict]) -> bool:
    """Whether the comparison's row is a copy of its reference (same script and arguments): the noise floor's pair."""
    rows = {run["name"]: run for run in matrix}
    row, reference = rows.get(comparison.row), rows.get(comparison.reference)
    return bool(row and reference) and (row["script"], row["args"]) == (reference["script"], reference["args"])


def run_speeds(runs) -> dict[int, float]:
    """images/s of each finished, measured run of `runs` (runs.csv), by job index."""
    import pandas as pd

    return {
        int(job): float(ips)
        for job, status, ips in zip(
            runs.job, runs.status, pd.to_numeric(runs.images_per_s, errors="coerce"), strict=True
        )
        if status == "ok" and pd.notna(ips) and pd.notna(job) and ips > 0
    }


def pair_ratios(runs, plan: list[tuple[Comparison, int, int, int]]) -> dict[Comparison, list[float]]:
    """Each comparison's pair ratios, round by round: images/s of the row's run over its adjacent reference run's,
    from `runs` (runs.csv: job, status, images_per_s). A pair where either run failed or was not measured is left
    out (so a comparison may have fewer ratios than rounds, or none)."""
    speed, ratios = run_speeds(runs), {}
    for comparison, _, row_job, reference_job in plan:
        found = ratios.setdefault(comparison, [])
        if row_job in speed and reference_job in speed:
            found.append(speed[row_job] / speed[reference_job])
    return ratios


def plan(
    matrix: list[dict], rounds: int, skipped: set[str]
) -> tuple[list[Job], list[tuple[Comparison, int, int, int]]]:
    """Every run of a bench, in order: the paired rounds (`schedule` of the comparisons whose two rows both run here,
    `skipped` naming the rows this machine cannot run), then each row in no comparison, `repeats` times, in matrix
    order (round -1). Returns (jobs, pairs) as `schedule`."""
    compared = [c for c in comparisons(matrix) if c.row not in skipped and c.reference not in skipped]
    jobs, pairs = schedule(compared, rounds)
    paired = {job.config for job in jobs}
    for run in matrix:
        if run["name"] not in paired and run["name"] not in skipped:
            jobs += [Job(run["name"], -1, len(jobs) + k) for k in range(run.get("repeats", 1))]
    return jobs, pairs


def plan_table(pairs: list[tuple[Comparison, int, int, int]], runs=None):
    """The pairs as a DataFrame (pairs.csv): row, reference, kind, round, row_job, reference_job, and with `runs`
    (runs.csv) each run's images/s and the pair's ratio (empty where a run failed or was not measured)."""
    import pandas as pd

    speed = run_speeds(runs) if runs is not None else {}
    return pd.DataFrame(
        [
            {
                "row": c.row, "reference": c.reference, "kind": c.kind, "round": r, "row_job": a, "reference_job": b,
                "row_images_per_s": speed.get(a), "reference_images_per_s": speed.get(b),
                "ratio": speed[a] / speed[b] if a in speed and b in speed else None,
            }
            for c, r, a, b in pairs
        ],
        columns=["row", "reference", "kind", "round", "row_job", "reference_job", "row_images_per_s",
                 "reference_images_per_s", "ratio"],
    )  # fmt: skip


def read_plan(table) -> list[tuple[Comparison, int, int, int]]:
    """`plan_table`'s inverse: the pairs of a pairs.csv."""
    return [
        (Comparison(r.row, r.reference, r.kind), int(r.round), int(r.row_job), int(r.reference_job))
        for r in table.itertuples()
    ]

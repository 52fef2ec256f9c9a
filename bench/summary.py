"""From runs to configurations: one row each with medians over its runs, its comparisons (the interleaved pairs'
ratios, spread and verdict) and what limited it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from pairs import MIN_PAIRS, Comparison, spread, verdict
from profiles import name_list
from runs import CONFIG_FIELDS, RUN_FIELDS

# What a configuration's row takes the median of over its ok runs: every measured number of a run (RUN_FIELDS but
# what names the configuration, the note and the step count).
MEDIAN_FIELDS = [
    f for f in RUN_FIELDS if f not in {"script", "technique", *CONFIG_FIELDS, "images_per_s_note", "steps"}
]


INPUT_BOUND = 0.25  # data-wait fraction from which a run counts as limited by its input
BELOW_CEILING = 0.9  # share of its synthetic ceiling under which a run is limited by its input's cost on the host


def summarise(
    runs: pd.DataFrame,
    matrix: list[dict],
    ratios: dict[Comparison, list[float]] | None = None,
    floor: float | None = None,
    disturbed: dict[Comparison, int] | None = None,
    to_target: tuple[dict, float | None, dict] | None = None,
    refused: str | None = None,
) -> pd.DataFrame:
    """One row per configuration, in matrix order: medians over its ok runs (min-max for images/s) and, from the
    interleaved pairs' undisturbed `ratios` (pairs.pair_ratios), each comparison's median ratio, spread and verdict
    against the noise floor `floor`, and how many of its pairs were left out as `disturbed` (`add_comparisons`);
    `to_target`: (ratios, floor, disturbed) of the same pairs' times to the target, as `x_target` (`add_target`);
    `refused`: why no comparison gets a verdict (pairs.refusal: a floor past --max-floor), None where they do. No
    ratio comes from single runs at different times."""
    rows = []
    for run in matrix:
        mine = runs[runs.config == run["name"]]
        ok = mine[mine.status == "ok"]
        row = {
            "config": run["name"],
            "script": Path(run["script"]).name,
            "technique": None,
            "note": run.get("note", ""),
            "baseline": run.get("baseline", ""),
            # a row may be a rung of several ladders (a point of several sweeps): the names joined by " | "
            **{key: " | ".join(name_list(run.get(key, [])) or []) for key in ("ladder", "sweep", "knob")},
            "rung_base": run.get("rung_base", ""),
            "same_as": run.get("same_as", ""),
            "ceiling": run.get("ceiling", ""),
            "ablation_of": run.get("ablation_of", ""),
            "memory": run.get("memory", ""),
            "runs_ok": len(ok),
            "runs": len(mine),
        }
        if len(ok):
            first = ok.iloc[0]
            row.update({key: first.get(key) for key in CONFIG_FIELDS}, technique=first.get("technique"))
            for key in MEDIAN_FIELDS:
                values = pd.to_numeric(ok[key], errors="coerce").dropna() if key in ok else pd.Series(dtype=float)
                row[key] = values.median() if len(values) else None
            row["images_per_s_min"] = pd.to_numeric(ok.images_per_s, errors="coerce").min()
            row["images_per_s_max"] = pd.to_numeric(ok.images_per_s, errors="coerce").max()
            row["status"], row["reason"] = (
                "ok",
                ""
                if len(ok) == len(mine)
                else "; ".join(f"r{r.repeat}: {r.status} {r.reason}" for r in mine.itertuples() if r.status != "ok"),
            )
        else:
            row["status"] = mine.status.iloc[0] if len(mine) else "not run"
            row["reason"] = mine.reason.iloc[0] if len(mine) else "interrupted before this configuration"
        rows.append(row)
    summary = pd.DataFrame(rows)
    if "images_per_s" not in summary:
        summary["images_per_s"] = None
    add_comparisons(summary, ratios or {}, floor, disturbed or {}, refused)
    add_target(summary, *(to_target or ({}, None, {})), refused=refused)
    summary["limited_by"] = [
        limited_by(w, c)
        for w, c in zip(
            pd.to_numeric(summary.data_wait_frac, errors="coerce"),
            pd.to_numeric(summary.of_ceiling, errors="coerce"),
            strict=True,
        )
    ]
    return summary


# The summary's columns for each kind of comparison (pairs.KINDS): the median pair ratio, then `_lo`, `_hi` (the
# min-max over the pairs), `_pairs` (how many), `_disturbed` (pairs left out) and `_verdict`.
COLUMNS = {
    "same_as": "x_self",
    "rung_base": "speedup_rung",
    "ablation_of": "of_whole",
    "ceiling": "of_ceiling",
    "memory": "x_memory",
    "sweep": "x_sweep",
}


def add_comparisons(
    summary: pd.DataFrame,
    ratios: dict[Comparison, list[float]],
    floor: float | None,
    disturbed: dict[Comparison, int] | None = None,
    refused: str | None = None,
) -> None:
    """Fill in `summary`'s comparison columns from each comparison's undisturbed pair ratios (`ratios`) and its count
    of pairs left out (`disturbed`), with verdicts against the noise floor `floor` (pairs.verdict; none where
    `refused` says why not); and the chains' products: `speedup`, a ladder rung over the ladder's first rung, and
    `x_sweep_first`, a sweep point over the sweep's first point, each the product of the links' ratios down the chain
    (median x median ..., its range the product of the links' ranges: a bound, as the links' pairs ran at different
    times; `_pairs` the fewest pairs of a link; "disturbed" when a link is)."""
    disturbed = disturbed or {}
    for column in [*COLUMNS.values(), "speedup", "x_sweep_first"]:
        for suffix in ("", "_lo", "_hi", "_pairs", "_disturbed", "_verdict"):
            summary[column + suffix] = None
    index = {name: i for i, name in enumerate(summary.config)}
    links: dict[str, dict] = {"rung_base": {}, "sweep": {}}
    for comparison, values in ratios.items():
        if comparison.row not in index:
            continue
        column, s, left_out = COLUMNS[comparison.kind], spread(values), disturbed.get(comparison, 0)
        i = index[comparison.row]
        summary.loc[i, f"{column}_disturbed"] = left_out
        summary.loc[i, f"{column}_verdict"] = verdict(values, floor, left_out, refused=refused)
        if comparison.kind in links:  # a link without a ratio too: a chain through it has no product
            judged = verdict(values, floor, left_out, refused=refused)
            links[comparison.kind][comparison.row] = (comparison.reference, s, len(values), judged)
        if s is None:
            continue
        summary.loc[i, [column, f"{column}_lo", f"{column}_hi"]] = s
        summary.loc[i, f"{column}_pairs"] = len(values)
    for kind, column in (("rung_base", "speedup"), ("sweep", "x_sweep_first")):
        for name in summary.config:  # the chain of links down to its first row
            product, seen, fewest, at, judged = (1.0, 1.0, 1.0), set(), None, name, set()
            broken = None  # the verdict of a link without any undisturbed ratio
            while at in links[kind] and at not in seen:
                seen.add(at)
                at, links_spread, n, link = links[kind][at]
                if links_spread is None:
                    broken = link
                    break
                median, lo, hi = links_spread
                product, fewest = (product[0] * median, product[1] * lo, product[2] * hi), min(n, fewest or n)
                judged.add(link)
            if broken is not None:  # no product over the first rung through a link that has none
                summary.loc[index[name], f"{column}_verdict"] = broken
            elif seen:
                i = index[name]
                summary.loc[i, [column, f"{column}_lo", f"{column}_hi"]] = product
                summary.loc[i, f"{column}_pairs"] = fewest
                summary.loc[i, f"{column}_verdict"] = (
                    "disturbed"
                    if "disturbed" in judged
                    else verdict([product[1], product[2]], floor, pairs=fewest, refused=refused)
                )


def add_target(
    summary: pd.DataFrame,
    ratios: dict[Comparison, list[float]],
    floor: float | None,
    disturbed: dict[Comparison, int],
    refused: str | None = None,
) -> None:
    """`x_target` (and `_lo`, `_hi`, `_pairs`, `_disturbed`, `_verdict`): a row's time to the target against its
    comparison's reference in the same interleaved pairs, the reference's seconds over the row's ("× sooner": above 1
    the row gets there first), its verdict against `floor`, the self pairs' spread of the same measure (none where
    `refused` says why not). A row with several comparisons takes the first of same_as, rung_base, ablation_of,
    ceiling, memory, sweep."""
    for suffix in ("", "_lo", "_hi", "_pairs", "_disturbed", "_verdict"):
        summary["x_target" + suffix] = None
    index = {name: i for i, name in enumerate(summary.config)}
    order = list(COLUMNS)
    for comparison in sorted(ratios, key=lambda c: order.index(c.kind), reverse=True):  # the first kind wins
        values, i = ratios[comparison], index.get(comparison.row)
        s = spread(values)
        if i is None or s is None:
            continue
        summary.loc[i, ["x_target", "x_target_lo", "x_target_hi"]] = s
        summary.loc[i, "x_target_pairs"] = len(values)
        summary.loc[i, "x_target_disturbed"] = disturbed.get(comparison, 0)
        summary.loc[i, "x_target_verdict"] = verdict(values, floor, disturbed.get(comparison, 0), refused=refused)


PRODUCTS = {"speedup": ("rung_base", "first_rung"), "x_sweep_first": ("sweep", "first_point")}  # column: link, kind


def floor_comparisons(
    summary: pd.DataFrame,
    comparisons: list[Comparison],
    floor: float | None,
    target_floor: float | None = None,
    target_ratios: dict[Comparison, list[float]] | None = None,
) -> list[dict]:
    """floors.json's comparisons (floors.floors_record), as the tables give them, from `summary`'s columns: each of
    `comparisons` (the plan's, in its order; of two with one row and kind, the last, as add_comparisons leaves the
    cell) whose row has a verdict in its kind's column (COLUMNS), measure "rate", against `floor`; each row's chain
    product (× its ladder's first rung, `speedup`, kind "first_rung"; × its sweep's first point, `x_sweep_first`,
    kind "first_point"), its reference the chain's first row; each row's time to the target (`x_target`, measure
    "time_to_target", against `target_floor`), its comparison the first in COLUMNS order of the row's that has
    `target_ratios` (without them, the first). `ratio`, `lo`, `hi` are None where the cell has none."""
    rows = {r["config"]: r for r in summary.to_dict("records")}

    def number(value):
        return None if value is None or pd.isna(value) else float(value)

    def whole(value):
        return None if value is None or pd.isna(value) else int(value)

    def entry(row: str, column: str, reference: str, kind: str, measure: str, against: float | None) -> dict | None:
        r = rows.get(row, {})
        said = r.get(column + "_verdict")
        if not isinstance(said, str) or not said:
            return None
        return {"row": row, "reference": reference, "kind": kind, "measure": measure, "ratio": number(r.get(column)),
                "lo": number(r.get(column + "_lo")), "hi": number(r.get(column + "_hi")),
                "pairs": whole(r.get(column + "_pairs")), "disturbed": whole(r.get(column + "_disturbed")),
                "verdict": said, "floor": against}  # fmt: skip

    by_kind = {(c.row, c.kind): c for c in comparisons if c.kind in COLUMNS}
    found = [entry(c.row, COLUMNS[c.kind], c.reference, c.kind, "rate", floor) for c in by_kind.values()]
    for column, (link, kind) in PRODUCTS.items():
        links = {c.row: c.reference for c in by_kind.values() if c.kind == link}
        for row in rows:
            at, seen = row, set()
            while at in links and at not in seen:  # down the chain to its first row
                seen.add(at)
                at = links[at]
            if seen:
                found.append(entry(row, column, at, kind, "rate", floor))
    order = list(COLUMNS)
    for row in rows:
        mine = sorted((c for c in by_kind.values() if c.row == row), key=lambda c: order.index(c.kind))
        timed = [c for c in mine if (target_ratios or {}).get(c)] if target_ratios is not None else mine
        if timed:
            found.append(entry(row, "x_target", timed[0].reference, timed[0].kind, "time_to_target", target_floor))
    return [e for e in found if e is not None]


def summary_floors(summary: pd.DataFrame) -> tuple[float | None, float | None]:
    """(floor, target floor), fractions, of a folder written before floors.json, from its summary.csv: the largest
    |ratio - 1| its self pairs' rows (`x_self` set) reached, from their min-max (`x_self_lo`, `x_self_hi`), where they
    hold 3 or more pairs together (pairs.noise_floor's rule); the same of their `x_target` for the times to a target.
    Every committed folder's single self pair is a copy of its reference, so this is the floor its table.md printed;
    a folder whose `same_as` row differed from its reference (pairs.is_self_pair) would need its own runs."""

    def floor_of(column: str) -> float | None:
        if column not in summary or "x_self" not in summary:
            return None
        rows = summary[summary["x_self"].notna() & summary[column].notna()]
        if pd.to_numeric(rows[column + "_pairs"], errors="coerce").sum() < MIN_PAIRS:
            return None
        return max(
            max(abs(float(lo) - 1), abs(float(hi) - 1))
            for lo, hi in zip(rows[column + "_lo"], rows[column + "_hi"], strict=True)
        )

    return floor_of("x_self"), floor_of("x_target")


def limited_by(data_wait: float, of_ceiling: float | None = None) -> str:
    """What limited a run: "input" when its steps waited for data 25 % of the time or more; "input (below ceiling)"
    when they waited less but the run reached under 90 % of its ceiling (the same model on a synthetic batch already
    on the device): the input pipeline's work takes time the training needs, which data-wait alone does not show (on
    a CPU, decoding takes the cores it trains on; on a GPU, workers compete with the host thread that queues the
    kernels, and DALI's `mixed` decoding runs on the same GPU); else
    "compute" (the device and the host's queueing of its work). "–" when not measured. A loader-only row is input by
    construction."""
    if data_wait is None or pd.isna(data_wait):
        return "–"
    if data_wait >= INPUT_BOUND:
        return "input"
    if of_ceiling is not None and pd.notna(of_ceiling) and of_ceiling < BELOW_CEILING:
        return "input (below ceiling)"
    return "compute"

"""floors.json, a result folder's noise floors and its comparisons' verdicts as data, beside summary.csv:
`floors_record`, `comparison_entry`, `floors_text` (write), `check_floors` and `read_floors` (read, its shape
checked). The bench writes it with table.md (bench.py write_tables), a study with its own table (bench/studies), and
`bench.py --floors-only` for a folder written before it; results/README.md and the pages read it
(bench/pages/results_index.py), never the floors printed in Markdown. docs/bench.md describes its keys.
"""

from __future__ import annotations

from pairs import spread, verdict

FLOORS = "floors.json"
FLOORS_FORMAT = 1
MEASURES = {  # what a comparison's ratio is of (floors.json's `measure`); above 1 the row is ahead
    "rate": "the row's images/s (tokens/s for a language model) over the reference's in the same pair",
    "time_to_target": "the reference's training seconds to the target over the row's in the same pair (x sooner)",
}


def comparison_entry(
    row: str, reference: str, kind: str, measure: str, ratios: list[float], floor: float | None, disturbed: int = 0
) -> dict:
    """floors.json's entry for one comparison from its undisturbed pair ratios (a study's; the bench reads its
    summary instead, summary.floor_comparisons): the median ratio, its min-max (`lo`, `hi`; None without a ratio),
    `pairs`, the `disturbed` pairs left out, the `verdict` against `floor` (`verdict`) and that floor."""
    s = spread(ratios)
    median, lo, hi = s if s is not None else (None, None, None)
    return {"row": row, "reference": reference, "kind": kind, "measure": measure, "ratio": median, "lo": lo, "hi": hi,
            "pairs": len(ratios), "disturbed": disturbed, "verdict": verdict(ratios, floor, disturbed),
            "floor": floor}  # fmt: skip


def floors_record(
    floor: float | None,
    comparisons: list[dict],
    written_by: str,
    target_floor: float | None = None,
    pairs_asked: int | None = None,
    pairs_run: int | None = None,
    stopped: str | None = None,
    max_floor: float | None = None,
    measures: dict[str, str] | None = None,
) -> dict:
    """floors.json's object: `floor`, the noise floor of the rates (a fraction: max |ratio - 1| over the self pairs'
    undisturbed ratios; None where fewer than 3 ran), `target_floor` (the same of the times to a target; None where
    no self pair ran to one), `comparisons` (entries as `comparison_entry` makes them, each with the floor its
    verdict stands against), who wrote it, the rounds asked and the fewest a comparison ran (`pairs_ran`), why the
    runs stopped before the plan's end (None where they did not), --max-floor as a fraction (None: not given), and
    what each comparison's `measure` is a ratio of (MEASURES, and a study's own `measures`)."""
    known = {**MEASURES, **(measures or {})}
    return {
        "format": FLOORS_FORMAT,
        "written_by": written_by,
        "floor": floor,
        "target_floor": target_floor,
        "max_floor": max_floor,
        "pairs_asked": pairs_asked,
        "pairs_run": pairs_run,
        "stopped": stopped,
        "measures": {m: known[m] for m in dict.fromkeys(c["measure"] for c in comparisons) if m in known},
        "comparisons": comparisons,
    }


def floors_text(record: dict) -> str:
    """floors.json's text (JSON, 2-space indent; NaN written as null). Raises ValueError where `record` does not pass
    `check_floors`."""
    import json
    import math

    def clean(value):
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        if hasattr(value, "item") and not isinstance(value, str):  # a numpy scalar from a DataFrame
            return clean(value.item())
        return value

    record = clean(record)
    check_floors(record)
    return json.dumps(record, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def _want(ok: bool, problem: str) -> None:
    """Raise ValueError(problem) unless `ok`: floors.json's checks, each a line."""
    if not ok:
        raise ValueError(problem)


def _number(value, bounded: bool = True) -> bool:
    """Whether `value` is null or a finite non-negative number (at most 1e6 where `bounded`: a fraction)."""
    import math

    if value is None:
        return True
    real = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return real and value >= 0 and (value <= 1e6 or not bounded)


def _whole(value) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


def check_floors(record) -> dict:
    """`record` if it has floors.json's shape (`floors_record`), else ValueError with what is wrong, in one line: a
    JSON object of format FLOORS_FORMAT whose floors are non-negative numbers or null, whose `comparisons` are
    objects each with text `row`, `reference`, `kind`, `measure` and `verdict`, numbers or null for `ratio`, `lo`,
    `hi` and `floor`, and whole numbers or null for `pairs` and `disturbed`; `pairs_asked` and `pairs_run` whole
    numbers or null, `stopped` text or null."""
    _want(isinstance(record, dict), f"not a JSON object but {type(record).__name__}")
    _want(record.get("format") == FLOORS_FORMAT, f"format {record.get('format')!r}, not {FLOORS_FORMAT}")
    for key in ("floor", "target_floor", "max_floor"):
        _want(_number(record.get(key)), f"{key} is {record.get(key)!r}, not a non-negative number or null")
    for key in ("pairs_asked", "pairs_run"):
        _want(_whole(record.get(key)), f"{key} is {record.get(key)!r}, not a whole number or null")
    stopped = record.get("stopped")
    _want(stopped is None or isinstance(stopped, str), f"stopped is {stopped!r}, not text or null")
    comparisons = record.get("comparisons")
    _want(isinstance(comparisons, list), f"comparisons is {type(comparisons).__name__}, not a list")
    for k, c in enumerate(comparisons):
        _want(isinstance(c, dict), f"comparisons[{k}] is {type(c).__name__}, not an object")
        for key in ("row", "reference", "kind", "measure", "verdict"):
            _want(isinstance(c.get(key), str), f"comparisons[{k}].{key} is {c.get(key)!r}, not text")
        for key in ("ratio", "lo", "hi", "floor"):
            _want(_number(c.get(key), bounded=False), f"comparisons[{k}].{key} is {c.get(key)!r}, not a number or null")
        for key in ("pairs", "disturbed"):
            _want(_whole(c.get(key)), f"comparisons[{k}].{key} is {c.get(key)!r}, not a whole number or null")
    return record


def read_floors(folder) -> dict | None:
    """A result folder's floors.json (`floors_record`'s object), None where the folder has none. Raises ValueError,
    one line naming the file, where it cannot be read or is not JSON of that shape (`check_floors`)."""
    import json
    from pathlib import Path

    path = Path(folder) / FLOORS
    if not path.exists():
        return None
    try:
        return check_floors(json.loads(path.read_text()))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ValueError(f"{path}: {str(error).splitlines()[0] if str(error) else type(error).__name__}") from None

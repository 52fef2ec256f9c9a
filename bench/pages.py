"""The "Measured now" block of each technique page (docs/techniques/<script>.md), written from the current folders
that results/current.toml names: every row of the page's script in each folder's summary.csv, its rate and its
comparison (× its base, the pairs' min–max, the verdict) and the folder's noise floor, as the folder's own tables give
them. The block sits between two markers; the rest of the page is written by hand and says which machine it speaks
of. A page without the markers gets the block before its "## Same training" section (else "## Run", else at the end).

    python bench/pages.py            # write the blocks
    python bench/pages.py --check    # exit 1 if a page's block is not what this would write (tests/test_docs.py)

A verdict is printed as the folder's floor allows it now (bench/pairs.py): "no measurable difference" from a floor
wider than NOISY_FLOOR reads "no verdict: noise floor ±N %" (an older folder's summary may say otherwise).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "src"))

from cells import ips_cell  # noqa: E402
from pairs import NOISY_FLOOR  # noqa: E402
from results_index import floor_pct, load_topics  # noqa: E402

import common  # noqa: E402
from tables import compared_cell  # noqa: E402

BEGIN = "<!-- measured: written by bench/pages.py from results/current.toml's folders; do not edit -->"
END = "<!-- /measured -->"
PAGES = REPO / "docs" / "techniques"


def floor_of(folder: Path) -> float | None:
    """The folder's noise floor as a fraction (results_index.floor_pct), None where it was not measured."""
    pct = floor_pct(folder)
    return pct / 100 if pct is not None else None


def allowed(cell: str, floor: float | None) -> str:
    """The comparison's cell with the verdict its floor allows: none without a floor, and within a floor wider than
    NOISY_FLOOR not "no measurable difference" but "no verdict"."""
    if floor is None:
        return re.sub(r", (faster|slower|no measurable difference)", ", no verdict (no noise floor)", cell)
    if floor > NOISY_FLOOR:
        return cell.replace(", no measurable difference", f", no verdict: noise floor ±{100 * floor:.0f} %")
    return cell


def rows_for(script: str, topics: list[dict]) -> list[str]:
    """The block's table rows: every ok row of `script` (not a copy of another row) in each current folder."""
    lines = []
    for topic in topics:
        folder = REPO / "results" / topic["folder"]
        try:
            summary = pd.read_csv(folder / "summary.csv")
        except (OSError, pd.errors.EmptyDataError):
            continue
        floor = floor_of(folder)
        floor_text = f"±{100 * floor:.1f} %" if floor is not None else "not measured"
        link = f"[`{topic['folder']}/`](../../results/{topic['folder']}/table.md)"
        for r in summary.to_dict("records"):
            if r.get("script") != script or r.get("status") != "ok" or pd.notna(r.get("same_as")):
                continue
            compared = allowed(compared_cell(r), floor)
            lines.append(f"| {topic['name']} ({link}) | {r['config']} | {ips_cell(r)} | {compared} | {floor_text} |")
    return lines


def block(script: str, topics: list[dict]) -> str:
    rows = rows_for(script, topics)
    body = (
        [
            "| topic (folder) | configuration | images/s or tokens/s | compared | noise floor |",
            "|---|---|---|---|---|",
            *rows,
        ]
        if rows
        else [f"No current folder has a row of `{script}` yet ([results/README.md](../../results/README.md))."]
    )
    intro = (
        "Every row of this script in the folders that [results/README.md](../../results/README.md) names current, as "
        "their tables give it (rates: the median over the row's runs; compared: × its base in interleaved pairs, "
        "min–max, verdict)."
    )
    return "\n".join([BEGIN, "## Measured now", "", intro, "", *body, END])


def with_block(text: str, new: str) -> str:
    """`text` with its block replaced by `new`, or `new` inserted before "## Same training" / "## Run" / at the end."""
    if BEGIN in text and END in text:
        start, end = text.index(BEGIN), text.index(END) + len(END)
        return text[:start] + new + text[end:]
    for heading in ("\n## Same training", "\n## Run"):
        if heading in text:
            at = text.index(heading) + 1
            return text[:at] + new + "\n\n" + text[at:]
    return text.rstrip("\n") + "\n\n" + new + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description="write each technique page's Measured now block")
    parser.add_argument("--check", action="store_true", help="exit 1 if a page's block is stale")
    args = parser.parse_args()
    topics = load_topics()
    stale = []
    for page in sorted(PAGES.glob("*.md")):
        script = page.stem + ".py"
        if not (REPO / "src" / script).is_file():
            continue  # a page of no script (cpu_launch.md)
        text = page.read_text()
        new = with_block(text, block(script, topics))
        if new != text:
            stale.append(page.relative_to(REPO))
            if not args.check:
                common.io.atomic_write_text(page, new)  # Ctrl-C leaves the page whole, old or new
    if args.check and stale:
        print(f"pages.py: stale blocks in {', '.join(map(str, stale))}: run python bench/pages.py", file=sys.stderr)
        raise SystemExit(1)
    if not args.check:
        print(f"pages.py: wrote {len(stale)} page(s)")


if __name__ == "__main__":
    main()

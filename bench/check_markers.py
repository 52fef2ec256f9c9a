"""Check the `# new #` convention: a variant script differs from its base only in lines it marks.

    python bench/check_markers.py                                 # every pair under src/ (train_X.py vs train.py, ...)
    python bench/check_markers.py src/train.py src/train_amp.py   # one pair: BASE VARIANT

Prints `file:line: problem` for each problem and exits 1 if there is any, 0 (with one summary line) otherwise.
The rules are in ../shared/DESIGN.md, "The `# new #` convention":
- a trailing `# new #` marks the whole (logical) statement it sits on; `# new # begin <why>` ... `# new # end`
  marks every statement between them (blocks close and do not nest); a comment-only `# new # <why>` line documents
  a base line that was removed or moved;
- the comparison is on logical lines: a statement's tokens joined by single spaces, so indentation, wrapping (with
  the trailing comma a formatter adds before a closing bracket) and comments never count;
- `difflib.SequenceMatcher` aligns the base with the variant's *unmarked* statements; a problem is an unmarked
  inserted or replaced statement, a removed base statement with no marker between its unmarked neighbours, a marked
  statement identical to the base statement it replaces, a variant with no marker, a marker in the base, a comment
  that looks like a marker but is not spelled exactly `# new #`, and a block that is unclosed, nested or ends twice.

`parse()` is the one logical-line parser of the project: the side-by-side pages use it too.
"""

from __future__ import annotations

import argparse
import difflib
import io
import re
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARKER = "# new #"
# Comments that look like an attempt at a marker: `#new#`, `# New #`, `# new#`, `# new:`, `# NEW`, `# nwe #` ...
LOOKS_LIKE_MARKER = re.compile(r"#\s*(new|nwe|enw|neww)\s*#|^#+\s*(new|nwe|enw|neww)\s*([#:\-]|$)", re.IGNORECASE)
SKIP = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER}


@dataclass
class Statement:
    """One logical line: its tokens joined by single spaces, its first and last physical line, and its marker."""

    text: str
    line: int
    end: int
    marked: bool = False  # a trailing `# new #` on one of its physical lines, or inside a begin/end block
    why: str = ""  # the explanation after the marker (or after the block's `begin`)


@dataclass
class Parsed:
    """A script as the checker sees it: statements, comment-only marker lines, and the problems found while parsing."""

    path: Path
    statements: list[Statement] = field(default_factory=list)
    notes: dict[int, str] = field(default_factory=dict)  # line -> kind: "note", "begin" or "end"
    problems: list[str] = field(default_factory=list)

    @property
    def has_markers(self) -> bool:
        return bool(self.notes) or any(s.marked for s in self.statements)


def _marker_kind(comment: str) -> tuple[str | None, str]:
    """("marker" | "begin" | "end" | "misspelled" | None, explanation) for one comment token."""
    if comment.startswith(MARKER):
        rest = comment[len(MARKER) :]
        if rest and not rest[0].isspace():
            return "misspelled", rest
        words = rest.split()
        first = words[0].rstrip(":") if words else ""
        if first in ("begin", "end"):
            return first, rest.strip()[len(first) :].lstrip(": ").strip()
        if first.lower() in ("begin", "end"):
            return "misspelled", rest
        return "marker", rest.strip()
    if LOOKS_LIKE_MARKER.search(comment):
        return "misspelled", comment
    return None, ""


def parse(path: Path, text: str | None = None) -> Parsed:
    """Split a Python file into logical statements and marker lines (see the module docstring).

    Raises nothing: a file that does not tokenize gives one problem instead.
    """
    path = Path(path)
    parsed = Parsed(path)
    source = path.read_text() if text is None else text
    tokens: list[str] = []
    first_line, marked, why = None, False, ""
    block_start, block_why = None, ""

    def problem(line: int, message: str) -> None:
        parsed.problems.append(f"{path}:{line}: {message}")

    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            line = tok.start[0]
            if tok.type == tokenize.COMMENT:
                kind, text_after = _marker_kind(tok.string)
                if kind is None:
                    continue
                if kind == "misspelled":
                    problem(line, f"comment looks like a marker but is not spelled `{MARKER}`: {tok.string!r}")
                    continue
                own_line = tok.line.strip().startswith("#") and not tokens
                if kind in ("begin", "end") and not own_line:
                    problem(line, f"`{MARKER} {kind}` must be a comment on its own line between statements")
                    continue
                if kind == "begin":
                    if block_start is not None:
                        problem(line, f"nested block: the block begun at line {block_start} is not closed yet")
                    block_start, block_why = line, text_after
                    parsed.notes[line] = "begin"
                elif kind == "end":
                    if block_start is None:
                        problem(line, f"`{MARKER} end` without a `{MARKER} begin`")
                    block_start, block_why = None, ""
                    parsed.notes[line] = "end"
                elif own_line:
                    parsed.notes[line] = "note"  # documents a removed or moved base line
                else:
                    marked, why = True, text_after
            elif tok.type == tokenize.NEWLINE:
                if tokens:
                    in_block = block_start is not None
                    parsed.statements.append(
                        Statement(
                            " ".join(tokens),
                            first_line,
                            line,
                            marked or in_block,
                            why or (block_why if in_block else ""),
                        )
                    )
                tokens, first_line, marked, why = [], None, False, ""
            elif tok.type not in SKIP:
                if first_line is None:
                    first_line = line
                if tok.string in ")]}" and tokens and tokens[-1] == ",":
                    tokens.pop()  # the formatter's trailing comma when it wraps a call: wrapping never counts
                tokens.append(tok.string)
    except (tokenize.TokenError, SyntaxError) as error:
        problem(1, f"cannot tokenize: {error}")
    if block_start is not None:
        problem(block_start, f"unclosed block: `{MARKER} begin` has no `{MARKER} end`")
    return parsed


def check(base_path: Path, variant_path: Path) -> list[str]:
    """All problems of `variant_path` against `base_path`, each as `file:line: message` (empty list: clean)."""
    base, variant = parse(base_path), parse(variant_path)
    problems = base.problems + variant.problems
    for s in base.statements:
        if s.marked:
            problems.append(f"{base.path}:{s.line}: the base script must not contain `{MARKER}` markers")
    for line, kind in base.notes.items():
        if kind != "end":
            problems.append(f"{base.path}:{line}: the base script must not contain `{MARKER}` markers")
    if not variant.has_markers:
        problems.append(f"{variant.path}:1: no `{MARKER}` marker: a variant marks what it adds to {base.path.name}")

    unmarked = [s for s in variant.statements if not s.marked]
    matcher = difflib.SequenceMatcher(
        None, [s.text for s in base.statements], [s.text for s in unmarked], autojunk=False
    )
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            for s in unmarked[j1:j2]:
                problems.append(f"{variant.path}:{s.line}: changed or added without a `{MARKER}` marker: {_short(s)}")
        if tag in ("replace", "delete"):
            # The base statements i1..i2 are missing between the unmarked neighbours lo and hi of the variant:
            # a marked statement or a marker line there is the change that explains them.
            lo = unmarked[j1 - 1].end if j1 > 0 else 0
            hi = unmarked[j2].line if j2 < len(unmarked) else 10**9
            removed = base.statements[i1:i2]
            marked_here = [s for s in variant.statements if s.marked and lo < s.line < hi]
            notes_here = [line for line in variant.notes if lo < line < hi]
            if not marked_here and not notes_here:
                at = hi if hi < 10**9 else lo
                for b in removed:
                    problems.append(
                        f"{variant.path}:{at}: {base.path.name}:{b.line} is removed here without a `{MARKER}` "
                        f"note: {_short(b)}"
                    )
            by_text = {b.text: b for b in removed}
            for s in marked_here:
                if s.text in by_text:
                    problems.append(
                        f"{variant.path}:{s.line}: marked, but identical to {base.path.name}:{by_text[s.text].line} "
                        f"(indentation and comments do not count): drop the marker"
                    )
    return sorted(set(problems), key=_order)


def _short(statement: Statement) -> str:
    return statement.text if len(statement.text) <= 80 else statement.text[:77] + "..."


def _order(problem: str) -> tuple:
    path, line, _ = problem.split(":", 2)
    return path, int(line) if line.isdigit() else 0, problem


def pairs(src: Path = REPO / "src") -> list[tuple[Path, Path]]:
    """Every (base, variant) pair in `src`: `<base>_<technique>.py` diffs against `<base>.py` when that exists."""
    found = []
    for variant in sorted(src.glob("*_*.py")):
        base = src / (variant.stem.split("_")[0] + ".py")
        if base.exists():
            found.append((base, variant))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="BASE VARIANT (default: every pair under src/)")
    args = parser.parse_args()
    if len(args.files) not in (0, 2):
        parser.error("give no file (every pair under src/) or exactly two: BASE VARIANT")
    for path in args.files:
        if not path.is_file():
            parser.error(f"{path} is not a file")
    todo = [tuple(args.files)] if args.files else pairs()
    if not todo:
        parser.error(f"no <base>_<technique>.py next to a <base>.py in {REPO / 'src'}")
    problems = [p for base, variant in todo for p in check(base, variant)]
    for p in problems:
        print(p)
    if problems:
        print(f"check_markers: {len(problems)} problem(s) in {len(todo)} pair(s)", file=sys.stderr)
        raise SystemExit(1)
    print(f"check_markers: ok, {len(todo)} pair(s): " + ", ".join(f"{v.name} vs {b.name}" for b, v in todo))


if __name__ == "__main__":
    main()

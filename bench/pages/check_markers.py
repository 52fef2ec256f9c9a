"""Check the `# new #` convention: each variant script differs from the base it declares only in lines it marks.

    python bench/pages/check_markers.py                                 # every (base, variant) pair under src/
    python bench/pages/check_markers.py src/train.py src/train_amp.py   # one pair: BASE VARIANT
    python bench/pages/check_markers.py --tree                          # the chains of variants, as a tree
    python bench/pages/check_markers.py --stats src                     # lines each pair's diff changes, and the mean

Prints `file:line: problem` for each problem and exits 1 if there is any, 0 (with one summary line) otherwise.
The rules (docs/markers.md has them with examples):
- A variant declares its base in the first line of its docstring, `Title: base.py + what it adds`; a script
  without such a line is a base (train.py, loader.py) and has no marker. The declared base must exist in the same
  folder, and chains must not loop. So a variant can build on any earlier one: train.py -> train_amp.py ->
  train_channels_last.py -> ...
- A trailing `# new #` marks its line and the (logical) statement it sits on; `# new # begin <why>` ...
  `# new # end` marks every line between them (blocks close and do not nest); a comment-only `# new # <why>` line
  (a note) marks nothing and may stand anywhere: it is what a removed or moved base statement needs where it was,
  or it explains the marked lines below it; a comment line may end in `# new #` (a rewritten header).
- Statements: a minimal diff (`opcodes`, a longest common subsequence as GNU diff finds) aligns the base's statements (tokens joined by single spaces, so
  indentation, wrapping and comments never count) with the variant's *unmarked* ones. A problem is an unmarked
  inserted or replaced statement, a removed base statement with no marker between its unmarked neighbours, or a
  marked statement identical to the base statement it replaces.
- Lines, as `diff -w base variant` shows them (whitespace ignored, blank lines skipped, markers stripped): every
  added or changed line carries a marker, sits in a block, or belongs to a marked statement that is new as a whole
  (none of its lines, closing brackets aside, is unchanged); in a statement changed in part (one keyword of a long
  call) each changed line has its own marker, and a marker on an unchanged line of it is a problem. A line whose
  code equals the base but whose comment or wrapping differs is a problem too (keep the base's).
- The module docstring is the script's own text (what it shows, its run lines): never compared, never marked.
- Also: a variant with no marker, a marker in a base, a comment that looks like a marker but is not spelled exactly
  `# new #`, a block that is unclosed, nested or ends twice.

`parse()` is the one parser of the project's scripts: the side-by-side pages use it too.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARKER = "# new #"
# Comments that look like an attempt at a marker: `#new#`, `# New #`, `# new#`, `# new:`, `# NEW`, `# nwe #` ...
LOOKS_LIKE_MARKER = re.compile(r"#\s*(new|nwe|enw|neww)\s*#|^#+\s*(new|nwe|enw|neww)\s*([#:\-]|$)", re.IGNORECASE)
SKIP = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER}
# The first docstring line of a variant: "Title: base.py + what it adds".
DECLARATION = re.compile(r"^(?P<title>[^:]+): (?P<base>[A-Za-z0-9_]+\.py) \+ (?P<adds>.+)$")
TRIVIAL = re.compile(r"^[()\[\]{},:;]*$")  # closing brackets and the like: shared by too many lines to count


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
    """A script as the checker sees it: statements, marker lines, and the problems found while parsing."""

    path: Path
    lines: list[str] = field(default_factory=list)  # the physical lines
    statements: list[Statement] = field(default_factory=list)
    notes: dict[int, str] = field(default_factory=dict)  # own-line markers: line -> "note", "begin", "end", "comment"
    marked_lines: dict[int, int] = field(default_factory=dict)  # line -> column where its trailing marker starts
    block_lines: set[int] = field(default_factory=set)  # lines inside a begin/end block
    docstring: range = range(0)  # the module docstring's lines: a script's own text, never compared
    problems: list[str] = field(default_factory=list)

    @property
    def has_markers(self) -> bool:
        return bool(self.notes) or any(s.marked for s in self.statements)

    def statement_at(self, line: int) -> Statement | None:
        for s in self.statements:
            if s.line <= line <= s.end:
                return s
        return None

    def diff_lines(self) -> list[tuple[int, str, str]]:
        """(line number, text, raw) of every non-blank line outside the module docstring, as `diff -w` compares them:
        `raw` with all whitespace removed, `text` the same without a trailing marker and what follows it (own-line
        marker lines keep theirs)."""
        out = []
        for n, line in enumerate(self.lines, start=1):
            if n in self.docstring:
                continue
            raw = re.sub(r"\s+", "", line)
            text = re.sub(r"\s+", "", line[: self.marked_lines[n]]) if n in self.marked_lines else raw
            if raw:
                out.append((n, text, raw))
        return out


def opcodes(a: list[str], b: list[str]) -> list[tuple[str, int, int, int, int]]:
    """A minimal diff of `a` and `b` (a longest common subsequence, as GNU diff finds), as difflib.SequenceMatcher's
    (tag, i1, i2, j1, j2) opcodes. difflib's own matcher anchors on the longest block and can misalign the rest."""
    n, m = len(a), len(b)
    lcs = [[0] * (m + 1) for _ in range(n + 1)]  # lcs[i][j]: longest common subsequence of a[i:] and b[j:]
    for i in range(n - 1, -1, -1):
        row, below = lcs[i], lcs[i + 1]
        for j in range(m - 1, -1, -1):
            row[j] = below[j + 1] + 1 if a[i] == b[j] else max(below[j], row[j + 1])
    pairs, i, j = [], 0, 0
    while i < n and j < m:
        if a[i] == b[j]:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif lcs[i + 1][j] >= lcs[i][j + 1]:
            i += 1
        else:
            j += 1
    out, i, j = [], 0, 0
    for pi, pj in [*pairs, (n, m)]:
        if i < pi or j < pj:
            tag = "replace" if i < pi and j < pj else ("delete" if i < pi else "insert")
            out.append((tag, i, pi, j, pj))
        if pi < n:
            if out and out[-1][0] == "equal" and out[-1][2] == pi and out[-1][4] == pj:
                out[-1] = ("equal", out[-1][1], pi + 1, out[-1][3], pj + 1)
            else:
                out.append(("equal", pi, pi + 1, pj, pj + 1))
        i, j = pi + 1, pj + 1
    return out


def _marker_kind(comment: str) -> tuple[str | None, str, int]:
    """("marker" | "begin" | "end" | "comment" | "misspelled" | None, explanation, column of the marker in the
    comment) for one comment token. "comment": an ordinary comment that ends in a marker (a rewritten header)."""
    at = 0
    if not comment.startswith(MARKER):
        at = comment.find(" " + MARKER)
        if at < 0 or LOOKS_LIKE_MARKER.search(comment[:at]):
            return ("misspelled", comment, 0) if LOOKS_LIKE_MARKER.search(comment) else (None, "", 0)
        at += 1
    rest = comment[at + len(MARKER) :]
    if rest and not rest[0].isspace():
        return "misspelled", rest, at
    if LOOKS_LIKE_MARKER.search(rest):
        return "misspelled", rest, at
    words = rest.split()
    first = words[0].rstrip(":") if words else ""
    if at:
        return "comment", rest.strip(), at
    if first in ("begin", "end"):
        return first, rest.strip()[len(first) :].lstrip(": ").strip(), at
    if first.lower() in ("begin", "end"):
        return "misspelled", rest, at
    return "marker", rest.strip(), at


def parse(path: Path, text: str | None = None) -> Parsed:
    """Split a Python file into logical statements and marker lines (see the module docstring).

    Raises nothing: a file that does not tokenize gives one problem instead.
    """
    path = Path(path)
    source = path.read_text() if text is None else text
    parsed = Parsed(path, source.splitlines())
    tokens: list[str] = []
    first_line, marked, why = None, False, ""
    block_start, block_why = None, ""

    def problem(line: int, message: str) -> None:
        parsed.problems.append(f"{path}:{line}: {message}")

    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            line = tok.start[0]
            if tok.type == tokenize.COMMENT:
                kind, text_after, at = _marker_kind(tok.string)
                if kind is None:
                    continue
                if kind == "misspelled":
                    problem(line, f"comment looks like a marker but is not spelled `{MARKER}`: {tok.string!r}")
                    continue
                own_line = tok.line.strip().startswith("#") and not tokens
                if kind in ("begin", "end", "comment") and not own_line:
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
                    else:
                        parsed.block_lines.update(range(block_start, line + 1))
                    block_start, block_why = None, ""
                    parsed.notes[line] = "end"
                elif kind == "comment":
                    parsed.notes[line] = "comment"  # a comment line rewritten for the variant
                    parsed.marked_lines[line] = tok.start[1] + at
                elif own_line:
                    parsed.notes[line] = "note"  # marks nothing: explains a removed base line, or the lines below
                else:
                    marked, why = True, text_after
                    parsed.marked_lines[line] = tok.start[1]
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
        parsed.block_lines.update(range(block_start, len(parsed.lines) + 1))
    parsed.docstring = _docstring_lines(source)
    parsed.statements = [s for s in parsed.statements if s.line not in parsed.docstring]
    return parsed


def _docstring_lines(source: str) -> range:
    """The lines of the module docstring (empty when there is none or the file does not parse). A variant's
    docstring is its own text (what it demonstrates, its run lines): it always differs from its base's, so the
    checker and the diff counts leave it out, and it needs no marker."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return range(0)
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return range(first.lineno, first.end_lineno + 1)
    return range(0)


@dataclass
class Comparison:
    """A variant against its base: the problems, and the lines the variant marks as new relative to that base
    (line -> explanation; a marker the base already had, identical on an unchanged line, is inherited, not new)."""

    problems: list[str]
    new_lines: dict[int, str]
    aligned: dict[int, int]  # variant line -> the base line `diff -w` aligns it with (unchanged code)


def compare(base_path: Path, variant_path: Path) -> Comparison:
    """Check `variant_path` against `base_path` (see the module docstring for the rules)."""
    base, variant = parse(base_path), parse(variant_path)
    problems = base.problems + variant.problems
    if declared_base(Path(base_path)) is None:  # a chain's root has no marker; a variant used as a base has its own
        for s in base.statements:
            if s.marked:
                problems.append(f"{base.path}:{s.line}: the base script must not contain `{MARKER}` markers")
        for line, kind in base.notes.items():
            if kind != "end":
                problems.append(f"{base.path}:{line}: the base script must not contain `{MARKER}` markers")

    # Lines as `diff -w` aligns them, with the markers stripped on both sides; an aligned line whose raw text differs
    # differs in its comment (or its marker).
    base_lines, variant_lines = base.diff_lines(), variant.diff_lines()
    changed, equal = set(), {}
    for tag, i1, i2, j1, j2 in opcodes([t for _, t, _ in base_lines], [t for _, t, _ in variant_lines]):
        if tag == "equal":
            equal.update({v[0]: b[0] for b, v in zip(base_lines[i1:i2], variant_lines[j1:j2], strict=True)})
        elif tag in ("replace", "insert"):
            changed.update(n for n, _, _ in variant_lines[j1:j2])
    base_raw, variant_raw = {n: r for n, _, r in base_lines}, {n: r for n, _, r in variant_lines}
    text = {n: t for n, t, _ in variant_lines}

    def same_as_base(n: int) -> bool:  # the line, comments and markers included, is the base's
        return n in equal and variant_raw[n] == base_raw[equal[n]]

    def inherited(s: Statement) -> bool:  # a marked statement the base has, marked the same way
        lines = [n for n in range(s.line, s.end + 1) if n in variant_raw and not TRIVIAL.match(text[n])]
        b = base.statement_at(equal[lines[0]]) if lines and lines[0] in equal else None
        return b is not None and b.marked and b.text == s.text and all(same_as_base(n) for n in lines)

    new_statements = [s for s in variant.statements if s.marked and not inherited(s)]
    new_notes = {n for n in variant.notes if not same_as_base(n)}
    if not new_statements and not new_notes:
        problems.append(f"{variant.path}:1: no `{MARKER}` marker: a variant marks what it adds to {base.path.name}")

    # Statements: the variant's statements without a new marker must be the base's, in order.
    reported = set()
    kept = [s for s in variant.statements if s not in new_statements]
    for tag, i1, i2, j1, j2 in opcodes([s.text for s in base.statements], [s.text for s in kept]):
        if tag in ("replace", "insert"):
            for s in kept[j1:j2]:
                reported.add(s.line)
                problems.append(f"{variant.path}:{s.line}: changed or added without a `{MARKER}` marker: {_short(s)}")
        if tag in ("replace", "delete"):
            # The base statements i1..i2 are missing between the kept neighbours lo and hi of the variant:
            # a newly marked statement or a new marker line there is the change that explains them.
            lo = kept[j1 - 1].end if j1 > 0 else 0
            hi = kept[j2].line if j2 < len(kept) else 10**9
            removed = base.statements[i1:i2]
            marked_here = [s for s in new_statements if lo < s.line < hi]
            notes_here = [line for line in new_notes if lo < line < hi]
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
                    reported.add(s.line)
                    problems.append(
                        f"{variant.path}:{s.line}: marked, but identical to {base.path.name}:{by_text[s.text].line} "
                        f"(indentation and comments do not count): drop the marker"
                    )

    # Lines: what `diff -w base variant` shows as added or changed must be marked.
    def whole(s: Statement) -> bool:  # new as a whole: no line of it, closing brackets aside, is unchanged
        return not any(n in equal and not TRIVIAL.match(text.get(n, "")) for n in range(s.line, s.end + 1))

    for n in sorted(changed):
        if n in variant.marked_lines or n in variant.block_lines or n in variant.notes or TRIVIAL.match(text[n]):
            continue  # marked, or a closing bracket that the alignment moved
        s = variant.statement_at(n)
        if s is None:
            problems.append(
                f"{variant.path}:{n}: a comment line `diff -w` shows as added or changed, without a marker: end it "
                f"with `{MARKER}` (a rewritten header), make it a `{MARKER} <why>` line, or keep the base's"
            )
        elif s not in new_statements:
            if s.line not in reported:
                problems.append(
                    f"{variant.path}:{n}: `diff -w` shows this line as changed, but its statement's code equals the "
                    f"base's: only a comment or the wrapping differs; keep the base's"
                )
        elif not whole(s):
            problems.append(
                f"{variant.path}:{n}: part of a statement changed in part, without its own marker: in a statement "
                f"changed in part, each changed line carries `{MARKER}`"
            )
    for n, b in sorted(equal.items()):
        if variant_raw[n] == base_raw[b] or n in variant.notes:
            continue
        s = variant.statement_at(n)
        if n not in variant.marked_lines or base_raw[b] != base_raw[b].split(MARKER.replace(" ", ""))[0]:
            problems.append(
                f"{variant.path}:{n}: `diff -w` shows this line as changed ({base.path.name}:{b}), but only its "
                f"comment or marker differs: keep the base's"
            )
        elif s is not None and n not in variant.block_lines and not whole(s) and s.line not in reported:
            problems.append(
                f"{variant.path}:{n}: marked, but the line is unchanged ({base.path.name}:{b}): in a statement "
                f"changed in part, mark the changed lines only"
            )

    new_lines = dict.fromkeys(new_notes, "")
    for s in new_statements:
        new_lines.update(dict.fromkeys(range(s.line, s.end + 1), ""))
        new_lines[s.line] = s.why
    return Comparison(sorted(set(problems), key=_order), new_lines, equal)


def check(base_path: Path, variant_path: Path) -> list[str]:
    """All problems of `variant_path` against `base_path`, each as `file:line: message` (empty list: clean)."""
    return compare(base_path, variant_path).problems


def _short(statement: Statement) -> str:
    return statement.text if len(statement.text) <= 80 else statement.text[:77] + "..."


def _order(problem: str) -> tuple:
    path, line, _ = problem.split(":", 2)
    return path, int(line) if line.isdigit() else 0, problem


def declared_base(script: Path) -> str | None:
    """The base file name a script declares in its docstring's first line (`Title: base.py + ...`), or None."""
    try:
        doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    except SyntaxError:
        return None
    match = DECLARATION.match(doc.splitlines()[0]) if doc else None
    return match["base"] if match else None


def title(script: Path) -> str:
    """What a script demonstrates: its docstring's first line up to the colon (the whole line for a base)."""
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    first = doc.splitlines()[0] if doc else ""
    match = DECLARATION.match(first)
    return match["title"] if match else first.split(":")[0]


def adds(script: Path) -> str:
    """What a script adds to its base, from its docstring's first line: the declaration's `what it adds` (a base's:
    the line after its title), without the closing full stop."""
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    first = doc.splitlines()[0] if doc else ""
    match = DECLARATION.match(first)
    return (match["adds"] if match else first.partition(": ")[2] or first).rstrip(".")


def scripts(src: Path = REPO / "src") -> list[Path]:
    """Every script under `src`: its *.py files (the shared package src/common/ is a folder, not a script)."""
    return sorted(src.glob("*.py"))


def chain_problems(src: Path = REPO / "src") -> list[str]:
    """Declarations that do not resolve: a base that is missing, a chain that loops, a marked script with no base."""
    problems = []
    for script in scripts(src):
        base = declared_base(script)
        if base is None:
            if parse(script).has_markers:
                problems.append(
                    f"{script}:1: has `{MARKER}` markers but declares no base: start its docstring with "
                    f"`Title: base.py + what it adds`"
                )
            continue
        if not (src / base).is_file():
            problems.append(f"{script}:1: declares base {base}, which is not in {src}")
            continue
        seen, current = {script.name}, base
        while current is not None:
            if current in seen:
                problems.append(f"{script}:1: its chain of bases loops back to {current}")
                break
            seen.add(current)
            current = declared_base(src / current) if (src / current).is_file() else None
    return problems


def pairs(src: Path = REPO / "src") -> list[tuple[Path, Path]]:
    """Every (base, variant) pair in `src`, from the variants' declarations, in file-name order."""
    found = []
    for variant in scripts(src):
        base = declared_base(variant)
        if base and (src / base).is_file():
            found.append((src / base, variant))
    return found


def tree(src: Path = REPO / "src") -> str:
    """The chains as a text tree: each base, then its variants indented below it (file-name order)."""
    children: dict[str | None, list[str]] = {}
    for script in scripts(src):
        base = declared_base(script)
        children.setdefault(base if base and (src / base).is_file() else None, []).append(script.name)
    lines = []

    def walk(name: str, prefix: str, last: bool, root: bool) -> None:
        lines.append(name if root else f"{prefix}{'└── ' if last else '├── '}{name}")
        kids = children.get(name, [])
        below = "" if root else prefix + ("    " if last else "│   ")
        for i, kid in enumerate(kids):
            walk(kid, below, i == len(kids) - 1, False)

    for root in sorted(children.get(None, []), key=lambda name: (not name.startswith("train"), name)):
        walk(root, "", True, True)
    return "\n".join(lines)


def in_tree_order(src: Path = REPO / "src") -> list[str]:
    """The scripts' names in the order `tree` prints them: each chain's root, then its variants, depth first."""
    return [line.split("── ")[-1] for line in tree(src).splitlines()]


def changed_lines(base_path: Path, variant_path: Path) -> int:
    """How many lines `diff -w base variant` shows as removed or added, module docstrings and blank lines left out:
    the size of a lesson's diff, the number `--stats` prints per pair."""
    base, variant = parse(base_path).diff_lines(), parse(variant_path).diff_lines()
    ops = opcodes([raw for _, _, raw in base], [raw for _, _, raw in variant])
    return sum(i2 - i1 + j2 - j1 for tag, i1, i2, j1, j2 in ops if tag != "equal")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="BASE VARIANT (default: every pair under src/)")
    parser.add_argument("--tree", action="store_true", help="print the chains of variants as a tree and exit")
    parser.add_argument(
        "--stats", type=Path, metavar="SRC", help="print each pair's changed lines (diff -w, docstrings left out)"
    )
    args = parser.parse_args()
    if args.tree:
        print(tree())
        return
    if args.stats:
        if not args.stats.is_dir():
            parser.error(f"--stats {args.stats} is not a folder (the scripts' folder, e.g. src)")
        counts = {f"{v.name} vs {b.name}": changed_lines(b, v) for b, v in pairs(args.stats)}
        for name, count in counts.items():
            print(f"{count:5d}  {name}")
        print(f"{sum(counts.values()) / max(1, len(counts)):7.1f}  mean lines changed per pair ({len(counts)} pairs)")
        return
    if len(args.files) not in (0, 2):
        parser.error("give no file (every pair under src/) or exactly two: BASE VARIANT")
    for path in args.files:
        if not path.is_file():
            parser.error(f"{path} is not a file")
    todo = [tuple(args.files)] if args.files else pairs()
    if not todo:
        parser.error(f"no script under {REPO / 'src'} declares a base (`Title: base.py + ...`)")
    problems = ([] if args.files else chain_problems()) + [p for base, v in todo for p in check(base, v)]
    for p in problems:
        print(p)
    if problems:
        print(f"check_markers: {len(problems)} problem(s) in {len(todo)} pair(s)", file=sys.stderr)
        raise SystemExit(1)
    print(f"check_markers: ok, {len(todo)} pair(s): " + ", ".join(f"{v.name} vs {b.name}" for b, v in todo))


if __name__ == "__main__":
    main()

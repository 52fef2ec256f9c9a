"""One-line errors: what a script prints when the user can fix the problem, instead of a traceback."""

from __future__ import annotations

import sys
from pathlib import Path


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none), at most 160 characters: what a
    one-line error quotes of a library's multi-line message."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:160]


def die(message: str, code: int = 2) -> None:
    """Print `message` as one line on stderr, prefixed with the script name, and exit with `code` (no traceback)."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)

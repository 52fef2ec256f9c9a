"""One-line errors: what a script prints when the user can fix the problem, instead of a traceback: `die`, the
process's excepthook (`install_error_hook`, which `cli.parse_args` installs) for the failures raised deep inside, and
the types of those failures (BadImage, WriteFailed), so that the hook needs no other module of the package: images.py
and io.py raise them and import them from here, never the other way round."""

from __future__ import annotations

import sys
from pathlib import Path

import torch


class BadImage(ValueError):
    """Raised by `images.load_rgb` for a file that is not a readable image; the scripts report it in one line and exit
    2 (`_report_user_errors`)."""


class WriteFailed(OSError):
    """A file could not be written (disk full, I/O error, its folder removed, a file size limit). Its message is one
    line that names the file and the operating system's error, e.g. "cannot write ck/last.pt (No space left on
    device)"; `path` and `reason` hold the two parts. `io.atomic_write` raises it after removing its temporary file, so
    the file that was there before is left as it was; the scripts report it in one line and exit 1."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"cannot write {path} ({reason})")
        self.path, self.reason = Path(path), reason


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none), at most 160 characters: what a
    one-line error quotes of a library's multi-line message."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:160]


def one_line(text: str) -> str:
    """`text` on one line whatever it holds: every line break and other control character (a path may hold a newline)
    written as Python writes it in a string literal (\\n, \\r, \\x1b), everything else as it is."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


def die(message: str, code: int = 2) -> None:
    """Print `message` as one line on stderr (`one_line`: a path with a newline in it stays on it), prefixed with the
    script name, and exit with `code` (no traceback)."""
    print(f"{Path(sys.argv[0]).name}: error: {one_line(message)}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def is_out_of_memory(kind, value) -> bool:
    """MemoryError, torch.OutOfMemoryError (CUDA), or the CPU allocator's RuntimeError "can't allocate memory"."""
    return issubclass(kind, (MemoryError, torch.OutOfMemoryError)) or (
        issubclass(kind, RuntimeError) and ("can't allocate memory" in str(value) or "out of memory" in str(value))
    )


def _report_user_errors(kind, value, traceback) -> None:
    """sys.excepthook: one line on stderr, no traceback, for what the user can fix or caused.

    A BadImage (raised here or re-raised from a DataLoader worker): exit 2. A file that cannot be written
    (WriteFailed: "cannot write PATH (No space left on device)"): exit 1. Out of memory: exit 3, with the first
    line of the allocator's message ("out of memory" in it, so the bench files the run as `oom`). Ctrl-C: exit 130.
    Anything else is a bug and keeps its traceback.
    """
    if issubclass(kind, BadImage):
        # from a worker the message is "Caught BadImage in DataLoader worker ... Original Traceback ...": keep the end
        die(str(value).strip().splitlines()[-1].removeprefix(f"{BadImage.__module__}.BadImage: "))
    if issubclass(kind, WriteFailed):
        die(str(value), code=1)
    if is_out_of_memory(kind, value):
        die(f"out of memory ({first_line(value)}); lower --batch-size (or --image-size, --workers)", code=3)
    if issubclass(kind, KeyboardInterrupt):
        die("interrupted (Ctrl-C); with --checkpoint-dir, add --resume to continue from the last checkpoint", code=130)
    sys.__excepthook__(kind, value, traceback)


def install_error_hook() -> None:
    """Make `_report_user_errors` the process's sys.excepthook (the scripts do it through `parse_args`)."""
    sys.excepthook = _report_user_errors

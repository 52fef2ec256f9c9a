"""Files that are whole or absent: atomic writes, and the probe that an output can be written before any work."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import WriteFailed, first_line  # WriteFailed: the type errors.py's hook reports, raised here


def _os_error(error: BaseException) -> OSError | None:
    """The OSError behind `error`: itself, or one in its chain of causes (torch.save reports a failed write of a
    Python file object as a RuntimeError whose context is the OSError)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def atomic_write(path: Path, write, before_replace=None) -> None:
    """Write `path` through a temporary file beside it (`.NAME.PID.tmp`): `write(f)` fills the binary file object
    `f`, which is then flushed, fsync'ed (the bytes are on disk before the rename) and renamed over `path`
    (`os.replace`, atomic on POSIX; the folder is fsync'ed after it). Readers never see half a file, and a process
    killed at any moment leaves either
    the old file or the new one (the temporary file of a SIGKILLed writer can stay: `save_checkpoint` removes those).
    `before_replace()`, when given, runs once the new bytes are on disk and before the rename: what must be on disk
    before the new file is (the digest list beside a checkpoint, `save_checkpoint`).

    Raises WriteFailed when the write fails with an OSError (ENOSPC, EIO, EFBIG under a file size limit, a vanished
    folder), directly or behind another exception (torch.save); a WriteFailed from `before_replace` (another file it
    could not write) as it is; anything else (a bug, Ctrl-C) is re-raised as it is. Either way the temporary file is
    removed first and `path` keeps what it held.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)  # the rename itself on disk, so that a crash right after keeps the new file
        finally:
            os.close(folder)
    except BaseException as error:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # the folder itself is gone: no temporary file left either
        if isinstance(error, WriteFailed):
            raise  # another file's write (before_replace's): its own line names it
        cause = _os_error(error) if isinstance(error, Exception) else None
        if cause is not None:
            raise WriteFailed(path, cause.strerror or first_line(cause)) from None
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` with `atomic_write`; raises WriteFailed (one line) when it cannot."""
    atomic_write(path, lambda f: f.write(text.encode()))


def output_problem(path: Path, is_folder: bool = False) -> str | None:
    """Why the file (or, with `is_folder`, the folder) `path` cannot be written, as the end of a sentence that starts
    with the path, or None when it can: "is a folder", "is a file, not a folder", "cannot be created: PARENT is a
    file", "cannot be created / written (Permission denied / Read-only file system...)".

    Creates the missing folders (the folder, or the file's parent) and writes and removes a probe file in it: a real
    write, because os.access says yes to root on a read-only filesystem or in /sys.
    """
    path = Path(path)
    if not is_folder and path.is_dir():
        return f"is a folder; give a file name, e.g. {path / 'metrics.json'}"
    if is_folder and path.exists() and not path.is_dir():
        return "is a file, not a folder"
    folder = path if is_folder else path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        files = [parent for parent in (folder, *folder.parents) if parent.is_file()]  # mkdir through or onto a file
        return f"cannot be created: {files[0]} is a file" if files else f"cannot be created ({error.strerror})"
    try:
        probe = folder / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        return f"cannot be written{' into' if is_folder else ''} ({error.strerror}); pick a folder you can write"
    return None

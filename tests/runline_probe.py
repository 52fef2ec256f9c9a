"""Parse run lines the way their scripts would, without running them: one process for all of them.

    python tests/runline_probe.py LINES.json

LINES.json is a list of [where, script, [args...]] (script relative to the repository root). Each script runs
unchanged (runpy, as `__main__`) with `sys.argv = [script, *args]` until its command line is parsed and checked, which
then stops it: for src/ scripts after `common.parse_args` (argparse, then the checks of flags that only make sense
together and of the outputs), for the bench's scripts after argparse. An unknown flag, a value outside a flag's choices
or of the wrong type, or a combination the script refuses fails as it would for a user (exit 2 and the one line), and
nothing else of the script runs. Checks a script makes later, after common.parse_args, are not reached. A --resume line
finds a last.pt in its --checkpoint-dir (it follows a run that saved there). Prints one line per failing run
line, `where: script args: the error`, and exits 1 if there is any.
"""

import argparse
import contextlib
import io
import json
import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))


class Parsed(Exception):
    """Raised right after a parser accepted the command line: the run line is valid."""


import common  # noqa: E402  (src/ on the path)

original_parse, original_common = argparse.ArgumentParser.parse_args, common.parse_args
inside_common = False


def parse_then_stop(self, args=None, namespace=None):
    parsed = original_parse(self, args, namespace)
    if inside_common:
        return parsed  # common.parse_args goes on to its own checks
    raise Parsed


def common_then_stop(parser, **options):
    global inside_common
    inside_common = True
    try:
        original_common(parser, **options)
    finally:
        inside_common = False
    raise Parsed


argparse.ArgumentParser.parse_args = parse_then_stop
common.parse_args = common_then_stop

failures = []
for where, script, args in json.loads(Path(sys.argv[1]).read_text()):
    sys.argv = [str(REPO / script), *args]
    err = io.StringIO()
    # a --resume line follows a run that saved in its --checkpoint-dir: a last.pt is there (never read: the probe stops
    # at the parse), and goes after the line
    folder = Path(args[args.index("--checkpoint-dir") + 1]) if "--checkpoint-dir" in args[:-1] else None
    saved = folder / "last.pt" if folder is not None and "--resume" in args else None
    if saved is not None and not saved.exists():
        folder.mkdir(parents=True, exist_ok=True)
        saved.touch()
    else:
        saved = None
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(str(REPO / script), run_name="__main__")
        failures.append(f"{where}: {script} {' '.join(args)}: ran to the end without parsing its flags")
    except Parsed:
        pass
    except SystemExit as stop:
        if stop.code not in (0, None):  # --help exits 0
            message = err.getvalue().strip().splitlines()
            failures.append(f"{where}: {script} {' '.join(args)}: {message[-1] if message else stop.code}")
    finally:
        if saved is not None:
            saved.unlink(missing_ok=True)
for line in failures:
    print(line)
sys.exit(1 if failures else 0)

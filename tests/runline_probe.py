"""Parse run lines the way their scripts would, without running them: one process for all of them.

    python tests/runline_probe.py LINES.json

LINES.json is a list of [where, script, [args...]] (script relative to the repository root). Each script runs
unchanged (runpy, as `__main__`) with `sys.argv = [script, *args]` until its argparse parser has parsed the command
line, which then stops it: an unknown flag, a value outside a flag's choices or of the wrong type fails as it would
for a user (exit 2 and argparse's message), and nothing else of the script runs. Prints one line per failing run
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


original = argparse.ArgumentParser.parse_args


def parse_then_stop(self, args=None, namespace=None):
    original(self, args, namespace)
    raise Parsed


argparse.ArgumentParser.parse_args = parse_then_stop

failures = []
for where, script, args in json.loads(Path(sys.argv[1]).read_text()):
    sys.argv = [str(REPO / script), *args]
    err = io.StringIO()
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
for line in failures:
    print(line)
sys.exit(1 if failures else 0)
